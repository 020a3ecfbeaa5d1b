"""The forward-size scan's shape: sizes skipped under fixed costs, gaps filled."""

from imitation_accum import planning
from imitation_accum.planning import forward_size
from tests.test_forward_size_tuner import Curve


class Recorded:
    """Seconds per transition from ``cost(size)``; records the sizes timed."""

    def __init__(self, cost):
        self.cost = cost
        self.sizes = []

    def __call__(self, size):
        self.sizes.append(size)
        return self.cost(size)


def test_fixed_costs_skip_ever_more_sizes_and_a_scan_that_improves_is_decided():
    """An MLP's calls cost about the same whatever their size: a few timings."""
    curve = Curve(per_call=2e-4, per_transition=1e-7)
    tuner = planning.ForwardSizeTuner()
    warm_ups = []
    assert tuner.tune(curve, 1600, warm_up=lambda: warm_ups.append(1)) == 1600
    grid = forward_size._doubling_sizes(1600)
    assert len(grid) == 12 and warm_ups == [1]
    timed = sorted(set(curve.sizes))
    # The stride doubles while calls stay cheap (4x, 16x, then past the end:
    # the largest size, always timed).
    assert timed == [1, 2, 8, 128, 1600]
    # Each improved on the last: no re-timing, one timing per size.
    assert len(curve.sizes) == len(timed)
    assert tuner.last_result.at_limit


def test_a_size_far_from_its_neighbour_may_be_far_faster_per_transition():
    """16x larger calls 12x faster per transition: plausible, not set aside.

    Sizes twice apart that far apart are not (the call doubled, the time per
    transition cannot fall 12x).
    """
    skipped = planning.ForwardSizeTuner()
    curve = Curve(per_call=2e-4, per_transition=1e-7)
    skipped.tune(curve, 1600)
    assert (8, None) in skipped.last_result.timings
    assert (128, None) in skipped.last_result.timings
    assert not skipped.last_result.excluded
    cost_ratio = curve.cost(8) / curve.cost(128)
    assert cost_ratio > skipped.pathological_ratio  # the old rule set 8 aside

    def cliff(size):
        return 1e-3 if size < 4 else 1e-3 / 12 / size * 4

    adjacent = planning.ForwardSizeTuner()
    adjacent.tune(Recorded(cliff), 4)
    assert (2, None) in adjacent.last_result.excluded


def test_the_skipped_sizes_next_to_the_best_are_timed():
    """Fixed costs up to 16, then a cliff: the scan skips 16, the fill finds it."""

    def cost(size):
        if size <= 16:
            return 1e-3 / size
        return 1e-3 / 16 * (1.2 + (size - 16) / 64)

    timing = Recorded(cost)
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(timing, 4096) == 16
    first = timing.sizes.index(16)
    # 16 was skipped by the scan (8, then 128 came first) and timed after it.
    assert {8, 128} <= set(timing.sizes[:first])
    assert cost(16) < cost(32) / 1.4


def test_a_net_whose_calls_grow_with_their_size_is_scanned_size_by_size():
    """A CNN-like curve: no call costs the same as one half its size."""
    curve = Curve(per_call=1e-3, per_transition=1e-3, cache_size=8)
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 4096) == 8
    timed = sorted(set(curve.sizes))
    assert timed[:5] == [1, 2, 4, 8, 16]
