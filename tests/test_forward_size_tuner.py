"""The forward-size tuner on noisy and shared machines, and its cost."""

import numpy as np
import pytest
import torch as th

from imitation_accum import planning
from imitation_accum.planning import call_timing, cpu_load, forward_size, tuning_search
from imitation_accum.planning import workload as planning_workload
from tests import reference as ref
from tests.test_preference_exactness import make_net, make_trainer


class Clock:
    """A fake ``perf_counter`` that the synthetic timings advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Curve:
    """Seconds per transition of calls of ``size``; optional injected noise.

    ``spikes[size]``: how many of the first timings of ``size`` are multiplied
    by ``spike`` (a one-off disturbance, as on a shared machine); ``always``:
    sizes whose every timing is (an implausible, persistent result).
    """

    def __init__(self, per_call, per_transition, cache_size=None, clock=None):
        self.per_call = per_call
        self.per_transition = per_transition
        self.cache_size = cache_size
        self.clock = clock
        self.spikes = {}
        self.always = set()
        self.spike = 100.0
        self.sizes = []

    def cost(self, size):
        cost = self.per_call + self.per_transition * size
        if self.cache_size is not None and size > self.cache_size:
            cost += 2 * self.per_transition * (size - self.cache_size)
        return cost / size

    def __call__(self, size):
        self.sizes.append(size)
        seconds = self.cost(size)
        if self.spikes.get(size, 0) > 0:
            self.spikes[size] -= 1
            seconds *= self.spike
        elif size in self.always:
            seconds *= self.spike
        if self.clock is not None:  # a measurement runs two calls at least
            self.clock.now += seconds * max(2 * size, 16)
        return seconds


def mlp_like():
    return Curve(per_call=2e-4, per_transition=1e-7)


def test_one_slow_timing_does_not_end_the_search():
    """A call of 2 timed 100x slower once: the search goes on to the whole chunk."""
    curve = mlp_like()
    curve.spikes = {2: 1}
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 1600) == 1600
    result = tuner.last_result
    assert result.at_limit and not result.excluded
    assert curve.sizes.count(2) >= 3  # re-timed, not taken from one timing


def test_a_size_that_stays_implausible_is_set_aside():
    curve = mlp_like()
    curve.always = {8}  # a size the scan times (fixed costs skip 4)
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 256) == 256
    assert (8, None) in tuner.last_result.excluded
    assert "set aside" in tuner.last_result.describe()


def test_contenders_get_repeated_timings_and_medians_decide():
    curve = Curve(per_call=1e-3, per_transition=1e-3, cache_size=8)
    curve.spikes = {8: 1}  # the true best, unlucky once
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 4096) == 8
    timings = tuner.last_result.timings
    for size in (4, 8, 16):
        assert len(timings[size, None]) >= tuner.repeats
    assert max(curve.sizes) <= 64  # the scan stops past the optimum


def test_the_budget_bounds_the_cost(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(forward_size.time, "perf_counter", clock)
    unbounded = Curve(per_call=2e-4, per_transition=1e-3, cache_size=512, clock=clock)
    planning.ForwardSizeTuner().tune(unbounded, 4096)
    unbounded_cost = clock.now
    clock.now = 0.0
    curve = Curve(per_call=2e-4, per_transition=1e-3, cache_size=512, clock=clock)
    tuner = planning.ForwardSizeTuner()
    epoch = 200  # transitions of an epoch: about 0.2 s at the best size
    size = tuner.tune(curve, 4096, budget_transitions=epoch)
    result = tuner.last_result
    assert clock.now < unbounded_cost / 2
    assert result.seconds <= 1.5 * result.budget_seconds
    assert len(result.timings[size, None]) >= tuner.repeats


def test_the_last_third_of_the_budget_is_kept_for_the_contenders(monkeypatch):
    """Near the best but not next to it: re-timed while two thirds are left.

    The best and its neighbours need the last third for their repeats.
    """
    clock = Clock()
    monkeypatch.setattr(forward_size.time, "perf_counter", clock)
    curve = Curve(per_call=1e-3, per_transition=1e-3, cache_size=8, clock=clock)
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 4096, budget_transitions=300) == 8
    timings = tuner.last_result.timings
    for contender in (4, 8, 16):
        assert len(timings[contender, None]) == tuner.repeats
    # Size 2 is within stop_ratio of the best's neighbourhood (near the best);
    # the budget being two-thirds spent, it is not re-timed.
    assert len(timings[2, None]) == 1
    assert clock.now <= 1.2 * tuner.last_result.budget_seconds


def test_a_scan_past_the_optimum_ends_without_a_budget_recheck(monkeypatch):
    """Two sizes in a row slower than the best: the last is timed once.

    The budget's re-check of a size (one noisy timing must not end a scan that
    still improves) would time it again although the scan ends there anyway:
    a whole timing of the largest calls so far.
    """
    clock = Clock()
    monkeypatch.setattr(forward_size.time, "perf_counter", clock)
    curve = Curve(per_call=1e-3, per_transition=1e-3, cache_size=8, clock=clock)
    tuner = planning.ForwardSizeTuner()
    # A third of this budget is spent while size 32 (the second size past the
    # optimum) is timed, not before, nor by 32's timing as foreseen from 16's.
    assert tuner.tune(curve, 4096, budget_transitions=900) == 8
    assert curve.sizes.count(32) == 1
    assert max(curve.sizes) == 32


def test_a_flat_scan_ends_before_a_timing_that_would_pass_its_share(monkeypatch):
    """Past the optimum, the next size's timing would spend the scan's third.

    Size 16 is past a cache cliff; 32, as slow per transition at least, would
    take the scan past its share of the budget: the scan ends at 16.
    """
    clock = Clock()
    monkeypatch.setattr(forward_size.time, "perf_counter", clock)
    curve = Curve(per_call=1e-3, per_transition=1e-3, cache_size=8, clock=clock)
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 4096, budget_transitions=800) == 8
    assert 32 not in curve.sizes


class TableCurve(Curve):
    """Seconds per transition read from a table (size -> seconds)."""

    def __init__(self, table, clock):
        super().__init__(per_call=0.0, per_transition=0.0, clock=clock)
        self.table = table

    def cost(self, size):
        return self.table[size]


def test_a_flattened_scan_ends_at_the_budget_without_a_recheck(monkeypatch):
    """No re-check of the last size where the sizes before it stopped improving.

    The re-check guards scans that halve their time with every doubling; here
    sizes 8 and 16 are no faster than 4, and 32 is past a cliff: timing it
    again would cost the most of any timing.
    """
    clock = Clock()
    monkeypatch.setattr(forward_size.time, "perf_counter", clock)
    table = {1: 1.3e-3, 2: 1.1e-3, 4: 1.0e-3, 8: 1.06e-3, 16: 1.1e-3, 32: 3e-3}
    curve = TableCurve(table, clock)
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 4096, budget_transitions=700) == 4
    assert curve.sizes.count(32) == 1


def test_an_improving_scan_runs_past_the_budget(monkeypatch):
    """Calls dominated by fixed costs: every doubling still pays, so go on."""
    clock = Clock()
    monkeypatch.setattr(forward_size.time, "perf_counter", clock)
    curve = mlp_like()
    curve.clock = clock
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 1600, budget_transitions=100) == 1600


def test_one_flat_timing_does_not_end_an_improving_scan_past_the_budget(monkeypatch):
    """A disturbance at one size, the budget spent: the scan still goes on."""
    clock = Clock()
    monkeypatch.setattr(forward_size.time, "perf_counter", clock)
    curve = mlp_like()
    curve.clock = clock
    curve.spikes = {128: 1}
    curve.spike = 2.5  # 128 looks slower than 64 once
    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(curve, 1600, budget_transitions=100) == 1600
    # Stopping at the first flat size (the old rule) would have kept 64.
    assert curve.cost(64) > 10 * curve.cost(1600)


def test_thread_counts_are_timed_and_the_faster_kept():
    ceilings = []

    def timing(size, ceiling=None):
        # Two threads wait for taken cores: small calls are far slower.
        overhead = 3e-2 if th.get_num_threads() > 1 else 2e-4
        ceilings.append((size, th.get_num_threads(), ceiling))
        return (overhead + 1e-7 * size) / size

    tuner = planning.ForwardSizeTuner()
    previous = th.get_num_threads()
    size = tuner.tune(timing, 64, thread_options=(2, 1), oversubscribed=True)
    assert th.get_num_threads() == previous
    result = tuner.last_result
    assert result.threads == 1 and size == 64
    assert (1, 2) in result.timings and (64, 1) in result.timings
    assert "CPU oversubscribed" in result.describe()
    # The first count is timed without a ceiling; the second at the same size
    # with OUTRUN_RATIO times the first's time per transition.
    first = [c for c in ceilings if c[0] == 2]
    assert first[0][1:] == (2, None)
    assert first[1][1] == 1
    assert first[1][2] == pytest.approx(
        tuning_search.OUTRUN_RATIO * result.timings[(2, 2)][0]
    )


def test_a_timing_stops_at_its_ceiling(monkeypatch):
    # A workload whose calls take 10 ms each: with a ceiling of 1 ms per
    # transition the first call already exceeds it, so one call is timed.
    class Slow:
        key = "slow"
        device = th.device("cpu")
        params = [th.zeros(1, requires_grad=True)]
        calls = []

        def sample(self, n):
            def call(start, stop):
                self.calls.append((start, stop))
                clock_sleep(0.01)
                return self.params[0].expand(stop - start) * 1.0

            return call, n

        def measuring(self, checkpointing=True):
            return contextlib.nullcontext()

    import contextlib
    import time

    def clock_sleep(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    workload = Slow()
    per_transition = planning_workload.time_per_transition(
        workload, 2, limit=64, transitions=32
    )
    # No ceiling: every call, as many as a timing runs at most.
    assert len(workload.calls) == planning_workload.MAX_CALLS_PER_TIMING == 4
    workload.calls.clear()
    per_transition = planning_workload.time_per_transition(
        workload, 2, limit=64, transitions=32, ceiling=1e-3
    )
    assert workload.calls == [(0, 2)]
    assert per_transition >= 0.01 / 2
    # Calls that long: the timing ends once its forward calls passed
    # TIMING_FORWARD_SECONDS (set to 25 ms here): after three calls, not four.
    workload.calls.clear()
    monkeypatch.setattr(planning_workload, "TIMING_FORWARD_SECONDS", 0.025)
    per_transition = planning_workload.time_per_transition(
        workload, 2, limit=64, transitions=32
    )
    assert workload.calls == [(0, 2), (2, 4), (4, 6)]
    assert per_transition >= 0.01 / 2


@pytest.mark.parametrize(
    "epoch, expected", [(None, 16), (100, 16), (3200, 100), (10**6, 256)]
)
def test_measurements_are_a_share_of_an_epoch(epoch, expected):
    assert planning_workload.measurement_transitions(epoch) == expected


def test_pass_timing_stops_when_two_passes_are_clearly_slower():
    weight = th.ones(3, requires_grad=True)
    runs = []

    def call(start, stop):
        runs.append(th.is_grad_enabled())
        return (th.ones(stop - start, 3) * weight).sum(1)

    call_timing.time_passes(call, 8, 4, [weight], th.device("cpu"))
    full = len(runs)
    runs.clear()
    call_timing.time_passes(call, 8, 4, [weight], th.device("cpu"), clear_ratio=0.0)
    assert full == 3 * (2 + 4) and len(runs) == 2 + 4  # one of each, then decided


def test_intra_op_threads_are_restored():
    previous = th.get_num_threads()
    with cpu_load.intra_op_threads(1):
        assert th.get_num_threads() == 1
    assert th.get_num_threads() == previous
    with pytest.raises(RuntimeError), cpu_load.intra_op_threads(1):
        raise RuntimeError("failed step")
    assert th.get_num_threads() == previous


@pytest.mark.parametrize(
    ("runnable", "busy"), [("1/120", False), ("2/120", True), ("5/300", True)]
)
def test_oversubscription_from_runnable_count(tmp_path, monkeypatch, runnable, busy):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"0.50 0.40 0.30 {runnable} 4242\n")
    monkeypatch.setattr(cpu_load, "LOADAVG", str(loadavg))
    monkeypatch.setattr(cpu_load, "cpu_count", lambda: 2)
    # Two intra-op threads: one other runnable thread already oversubscribes.
    assert cpu_load.oversubscribed(threads=2) == busy
    assert not cpu_load.oversubscribed(threads=1) or runnable == "5/300"


@pytest.mark.parametrize(
    ("readings", "busy", "read"),
    [
        ([1, 1, 5], False, 2),  # two agree: no third reading
        ([5, 5, 1], True, 2),
        ([1, 5, 5], True, 3),  # they disagree: the third settles it
        ([5, 1, 1], False, 3),
    ],
)
def test_load_readings_agree_or_a_third_settles(monkeypatch, readings, busy, read):
    events = []

    def reading():
        events.append("read")
        return readings[events.count("read") - 1]

    monkeypatch.setattr(cpu_load, "read_runnable", reading)
    monkeypatch.setattr(cpu_load, "cpu_count", lambda: 2)
    found = cpu_load.oversubscribed(threads=1, between=lambda: events.append("work"))
    assert found == busy
    assert events.count("read") == read
    assert events[:3] == ["read", "work", "read"]  # the work spaces the first two


def test_unreadable_load_is_not_busy(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_load, "LOADAVG", str(tmp_path / "missing"))
    assert cpu_load.read_runnable() is None
    assert not cpu_load.oversubscribed()
    ran = []
    assert not cpu_load.oversubscribed(between=lambda: ran.append(True))
    assert ran == [True]  # the work between the readings runs all the same


def tuned_planner(name, **tuning):
    """A planner whose workload ``name`` was tuned to size 8 as ``tuning`` says."""
    planner = planning.Planner(minibatch_size=None, two_pass=False)
    messages = []
    planner.log = messages.append

    class Workload:
        key = (name,)

    planner.forward_sizes.found[Workload.key] = (8, False)
    planner.forward_sizes.results[Workload.key] = forward_size.TuningResult(
        size=8, at_limit=False, excluded={}, seconds=0.0, budget_seconds=None, **tuning
    )
    return planner, Workload(), Workload.key, messages


def test_steps_alternate_thread_counts_then_keep_the_faster():
    planner, workload, key, messages = tuned_planner(
        "test-threads",
        threads=None,
        # Calls alike, far shorter than the steps: the steps decide.
        timings={(8, 2): [0.01], (8, 1): [0.012]},
        oversubscribed=True,
        thread_options=(2, 1),
    )
    previous = th.get_num_threads()
    seen = []
    clock = Clock()

    def step(plan):
        seen.append(th.get_num_threads())
        return plan

    import imitation_accum.planning.planner as planner_module

    original = planner_module.time.perf_counter
    calls = []

    def fake_clock():
        # Steps with two threads take 5 s, with one 1 s (begin, end pairs).
        calls.append(None)
        if len(calls) % 2:
            clock.now += 0.0
        else:
            clock.now += 5.0 if seen[-1] == 2 else 1.0
        return clock.now

    planner_module.time.perf_counter = fake_clock
    try:
        for _ in range(4):
            planner.run(np.array([5, 5]), step, workload, device=th.device("cpu"))
    finally:
        planner_module.time.perf_counter = original
    assert th.get_num_threads() == previous
    assert seen[:2] == [2, 1]  # one step each, then a clear winner
    assert seen[2:] == [1, 1]
    assert planner.forward_sizes.threads(key) == 1
    assert any(m.startswith("intra-op threads: 1") for m in messages), messages


def test_auto_forward_size_logs_what_it_measured(rng):
    dataset = ref.make_dataset(rng, 6, (5,))
    trainer = make_trainer(make_net(), batch_size=6, minibatch_size=3)
    messages = []
    trainer.planner.log = messages.append
    trainer.train(dataset)
    tuned = [m for m in messages if m.startswith("forward_size:")]
    assert len(tuned) == 1
    assert "median time per transition" in tuned[0] and "tuning" in tuned[0]
    assert trainer.planner.tuning_seconds > 0


def test_the_load_check_counts_as_tuning(rng, monkeypatch):
    """Reading the machine's load is part of what forward_size="auto" costs."""
    import time

    def slow_check(threads=None, between=None):
        time.sleep(0.2)
        if between is not None:
            between()
        return False

    monkeypatch.setattr(cpu_load, "oversubscribed", slow_check)
    trainer = make_trainer(make_net(), batch_size=6, minibatch_size=3)
    trainer.train(ref.make_dataset(rng, 6, (5,)))
    assert trainer.planner.tuning_seconds >= 0.2


def test_chosen_seconds_when_the_step_trial_picks_threads_not_timed_at_that_size():
    # The step trial chose 1 thread, timed only at size 4; size 8 ran with the
    # default count. The planner's budget arithmetic still reads size 8's time.
    result = forward_size.TuningResult(
        size=8,
        at_limit=False,
        threads=1,
        timings={(8, None): [3.0, 1.0, 2.0], (4, 1): [5.0], (4, None): [6.0]},
        excluded={},
        seconds=0.1,
        budget_seconds=None,
    )
    assert result.chosen_seconds() == 2.0
    result.threads = None
    assert result.chosen_seconds() == 2.0


def test_busy_one_thread_calls_are_timed_in_cpu_time():
    """Time a call spends off the core (another job's slice) does not count."""
    import contextlib
    import time

    class Preempted:
        key = "preempted"
        device = th.device("cpu")
        params = [th.zeros(1, requires_grad=True)]

        def sample(self, n):
            def call(start, stop):
                time.sleep(0.02)  # descheduled: wall time passes, CPU time not
                return self.params[0].expand(stop - start) * 1.0

            return call, n

        def measuring(self, checkpointing=True):
            return contextlib.nullcontext()

    workload = Preempted()
    with cpu_load.intra_op_threads(1):
        busy = planning_workload.time_per_transition(
            workload, 2, limit=8, transitions=8, busy=True
        )
        wall = planning_workload.time_per_transition(
            workload, 2, limit=8, transitions=8
        )
        assert cpu_load.call_clock(True) is time.thread_time
    assert wall >= 0.02 / 2  # the wall clock counts the time off the core
    assert busy.seconds < wall / 10
    assert busy.wall_seconds >= 0.02 / 2  # returned with the same calls' wall time
    with cpu_load.intra_op_threads(2):  # a team also waits: only wall time sees it
        assert cpu_load.call_clock(True) is time.perf_counter
    assert cpu_load.call_clock(False) is time.perf_counter


def test_a_thread_count_outrun_is_not_re_timed():
    """Two threads 60x slower at size 2 (a team waiting): timed once, dropped."""
    counts = {}

    def timing(size, ceiling=None):
        threads = th.get_num_threads()
        counts[size, threads] = counts.get((size, threads), 0) + 1
        overhead = 3e-2 if threads > 1 and size > 1 else 2e-4
        return (overhead + 1e-7 * size) / size

    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(timing, 64, thread_options=(1, 2), oversubscribed=True) == 64
    assert (2, 2) in tuner.last_result.timings
    # Implausibly far from size 1 at two threads, but outrun: not re-timed.
    assert counts[2, 2] == 1 and not tuner.last_result.excluded


def one_thread_cpu_seconds(size):
    """A CNN-like call: one thread's CPU seconds per transition."""
    return (2e-3 + 1e-3 * size) / size


def busy_timing(ceilings, with_wall_clock=True):
    """One thread in CPU time getting half its core; two threads on the wall clock.

    Two threads take 1.6x one thread's CPU time per transition on the wall
    clock: more than one thread's CPU time, less than its 2x wall-clock time.
    """

    def timing(size, ceiling=None):
        threads = th.get_num_threads()
        ceilings.append((size, threads, ceiling))
        cpu = one_thread_cpu_seconds(size)
        if threads > 1:
            return 1.6 * cpu
        if not with_wall_clock:
            return cpu
        return tuning_search.ClockedTiming(cpu, 2.0 * cpu)

    return timing


def test_thread_counts_are_compared_on_the_wall_clock():
    """One thread timed in CPU time, two on the wall clock: two are faster."""
    ceilings = []
    tuner = planning.ForwardSizeTuner()
    tuner.tune(busy_timing(ceilings), 64, thread_options=(1, 2), oversubscribed=True)
    result = tuner.last_result
    assert result.threads == 2
    assert result.wall_factors == {1: pytest.approx(2.0)}
    assert result.median((64, 1)) == pytest.approx(2.0 * one_thread_cpu_seconds(64))
    assert result.median((64, 2)) == pytest.approx(1.6 * one_thread_cpu_seconds(64))
    assert "1 thread(s) timed in CPU time, scaled by 2" in result.describe()
    # The same timings without their wall-clock seconds: one thread's CPU time
    # against two threads' wall-clock time, and one thread would be kept.
    tuner.tune(
        busy_timing([], with_wall_clock=False),
        64,
        thread_options=(1, 2),
        oversubscribed=True,
    )
    assert tuner.last_result.threads == 1 and not tuner.last_result.wall_factors


def test_a_ceiling_is_given_on_the_timings_clock():
    """Two threads first: one thread's ceiling is in CPU time, wall time / factor."""
    ceilings = []
    tuner = planning.ForwardSizeTuner()
    tuner.tune(busy_timing(ceilings), 64, thread_options=(2, 1), oversubscribed=True)
    result = tuner.last_result
    size = 2  # timed in the scan once the wall factor is known (from size 1)
    scan = [c for c in ceilings if c[0] == size]
    assert scan[0][1:] == (2, None) and scan[1][1] == 1
    wall_ceiling = tuning_search.OUTRUN_RATIO * result.timings[(size, 2)][0]
    assert scan[1][2] == pytest.approx(wall_ceiling / 2.0)


def test_a_thread_count_far_behind_is_not_re_timed():
    """Two threads 1.5x slower at every size: scanned, but only one is re-timed."""
    counts = {}

    def timing(size, ceiling=None):
        threads = th.get_num_threads()
        counts[size, threads] = counts.get((size, threads), 0) + 1
        cpu = (2e-3 + 1e-3 * size + 1e-4 * size**2) / size  # best at 4
        return cpu if threads == 1 else 1.5 * cpu

    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(timing, 16, thread_options=(1, 2), oversubscribed=True) == 4
    result = tuner.last_result
    assert result.threads == 1
    assert counts[4, 1] == tuner.repeats
    two = {size: n for (size, threads), n in counts.items() if threads == 2}
    assert len(two) >= 2 and set(two.values()) == {1}, two


def test_a_thread_count_whose_calls_outlast_a_step_is_not_tried():
    """Steps of 2 s per transition with two threads; one thread's calls take 3 s."""
    planner, workload, key, messages = tuned_planner(
        "test-cannot-win",
        threads=2,
        timings={(8, 2): [1.8], (8, 1): [1.5]},  # one thread's in CPU time
        oversubscribed=True,
        thread_options=(1, 2),
        wall_factors={1: 2.0},
    )
    seen = []

    def step(plan):
        seen.append(th.get_num_threads())
        return plan

    import imitation_accum.planning.planner as planner_module

    clock = Clock()
    original = planner_module.time.perf_counter

    def fake_clock():
        clock.now += 10.0  # 20 s a step: 2 s per transition over 10
        return clock.now

    planner_module.time.perf_counter = fake_clock
    try:
        for _ in range(3):
            planner.run(np.array([5, 5]), step, workload, device=th.device("cpu"))
    finally:
        planner_module.time.perf_counter = original
    assert seen == [2, 2, 2]
    assert planner.forward_sizes.threads(key) == 2
    decided = [m for m in messages if m.startswith("intra-op threads: 2")]
    assert len(decided) == 1 and "1 thread(s) not tried" in decided[0], messages


def test_a_thread_count_that_improves_is_scanned_past_a_faster_one():
    """Two threads slower at small calls (a team waiting), faster at large ones."""
    two_threads = {1: 1.8e-3, 2: 1.4e-3, 4: 0.9e-3, 8: 0.8e-3, 16: 0.85e-3}

    def timing(size, ceiling=None):
        return 1e-3 if th.get_num_threads() == 1 else two_threads[size]

    tuner = planning.ForwardSizeTuner()
    assert tuner.tune(timing, 16, thread_options=(1, 2), oversubscribed=True) == 8
    assert tuner.last_result.threads == 2
