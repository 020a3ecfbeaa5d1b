"""The planner: chunks cover the batch in order; forward sizes are measured."""

import numpy as np
import pytest

from imitation_accum import planning
from tests import reference as ref
from tests.test_preference_exactness import make_net, make_trainer


@pytest.mark.parametrize("n_items", [1, 7, 12])
@pytest.mark.parametrize("minibatch_size", [None, 1, 5, 12])
def test_chunks_cover_the_batch_in_order(n_items, minibatch_size):
    chunks = planning.plan_chunks(n_items, minibatch_size)
    covered = [i for s in chunks for i in range(n_items)[s]]
    assert covered == list(range(n_items))
    assert all(s.stop - s.start == (minibatch_size or n_items) for s in chunks[:-1])


class Timings:
    """A synthetic cost curve: seconds for a call of ``size`` transitions."""

    def __init__(self, per_call, per_transition, cache_size=None):
        self.per_call = per_call
        self.per_transition = per_transition
        self.cache_size = cache_size
        self.sizes = []

    def __call__(self, size):
        """Seconds per transition in calls of ``size``."""
        self.sizes.append(size)
        cost = self.per_call + self.per_transition * size
        if self.cache_size is not None and size > self.cache_size:
            # spilling out of cache: each extra transition costs three times more
            cost += 2 * self.per_transition * (size - self.cache_size)
        return cost / size


def test_overhead_bound_calls_take_the_whole_chunk():
    timings = Timings(per_call=1e-3, per_transition=1e-6)
    assert planning.ForwardSizeTuner().tune(timings, 3000) == 3000


def test_cache_bound_calls_stop_past_the_optimum():
    timings = Timings(per_call=1e-3, per_transition=1e-3, cache_size=8)
    size = planning.ForwardSizeTuner().tune(timings, 4096)
    assert size == 8
    assert max(timings.sizes) <= 32  # the search stops soon after the optimum


def test_tuned_sizes_are_cached_per_key():
    timings = Timings(per_call=1e-3, per_transition=1e-3, cache_size=4)
    sizes = planning.ForwardSizes()
    key = ("test-cache-bound", id(timings))
    assert sizes.size(key, 100, timings) == 4
    calls = len(timings.sizes)
    assert sizes.size(key, 50, timings) == 4
    assert sizes.size(key, 3, timings) == 3
    assert len(timings.sizes) == calls
    flat = Timings(per_call=1e-3, per_transition=1e-7)
    key = ("test-overhead-bound", id(flat))
    assert sizes.size(key, 64, flat) == 64
    # a search that ended at its limit says: the larger the better
    assert sizes.size(key, 500, flat) == 500


def test_each_planner_owns_its_tuned_sizes():
    timings = Timings(per_call=1e-3, per_transition=1e-3, cache_size=4)
    key = ("test-owned", id(timings))
    first, second = (
        planning.Planner(minibatch_size=None),
        planning.Planner(minibatch_size=None),
    )
    first.forward_sizes.size(key, 100, timings)
    calls = len(timings.sizes)
    second.forward_sizes.size(key, 100, timings)
    assert len(timings.sizes) == 2 * calls  # no process-wide cache


def test_auto_forward_size_is_chosen_and_logged(rng, monkeypatch):
    dataset = ref.make_dataset(rng, 6, (5,))
    trainer = make_trainer(make_net(), batch_size=6, minibatch_size=3)
    # A cost curve instead of the clock: per transition 1/size + size/8, so
    # sizes 1, 2, 4, 8, 16 cost 1.125, 0.75, 0.75, 1.125, 2.06; 8 and 16 are two
    # sizes in a row past the optimum (the scan stops) and 2 is the smallest of
    # the fastest.
    tried = []

    def measure(self, candidate, ceiling=None):
        size, _ = candidate
        tried.append(size)
        self.timings.setdefault(candidate, []).append(1 / size + size / 8)

    monkeypatch.setattr(planning.tuning_search.TuningSearch, "measure", measure)
    trainer.train(dataset)
    size = trainer.logger.name_to_value["reward/final/train/forward_size"]
    assert sorted(set(tried)) == [1, 2, 4, 8, 16]
    assert size == 2
    assert np.isfinite(trainer.logger.name_to_value["reward/final/train/loss"])
