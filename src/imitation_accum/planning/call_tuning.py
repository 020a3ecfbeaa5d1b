"""What ``forward_size="auto"`` times: call sizes, one pass against two, threads.

:class:`CallTuning` belongs to a planner. On the first request for a workload
it reads the machine's load (the first calls of the net spacing the readings)
and has its :class:`~imitation_accum.planning.forward_size.ForwardSizes` time
the call sizes within about one epoch's work; on the first chunk whose calls
are smaller than the chunk it times one pass against two with what is left of
that budget; on a busy CPU its
:class:`~imitation_accum.planning.thread_trial.ThreadTrial` tries the intra-op
thread counts on the first steps.
"""

import functools
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch as th

from imitation_accum.planning import cpu_load
from imitation_accum.planning.call_timing import REPEATS, time_passes
from imitation_accum.planning.forward_size import ForwardSizes, TuningResult
from imitation_accum.planning.thread_trial import ThreadTrial
from imitation_accum.planning.workload import (
    Workload,
    measurement_transitions,
    time_per_transition,
)

#: Two passes are chosen for speed only if they take under this share of one pass.
TWO_PASS_MARGIN = 0.9
#: Tuning (forward size, then one pass against two) may take about this many
#: epochs' worth of reward-net work.
TUNING_BUDGET_EPOCHS = 1.0
#: Work of timing one pass and two passes, ``REPEATS`` times each, in units of
#: one pass (two passes run a forward more).
PASS_TIMING_PASSES = REPEATS * 2.5


def _ran_already() -> None:
    """A warm-up that has run already."""


class CallTuning:
    """The timings behind a planner's ``forward_size="auto"``.

    Args:
        forward_sizes: The cache of tuned sizes (shared by ensemble members).
        log: Where the decisions are written.
    """

    def __init__(
        self,
        forward_sizes: ForwardSizes,
        log: Callable[[str], None],
    ) -> None:
        self.forward_sizes = forward_sizes
        self.log = log
        self.seconds = 0.0
        """Wall-clock seconds spent timing calls (the load check included)."""
        # (chunk transitions, forward size) -> (two-pass?, t_one, t_two)
        self.timings: Dict[Tuple[int, int], Tuple[bool, float, float]] = {}
        self.thread_trial = ThreadTrial(log=lambda message: self.log(message))
        """On a busy CPU, which intra-op thread count the steps run with."""

    def call_size(self, workload: Workload, limit: int) -> int:
        """The tuned transitions per call for calls of at most ``limit``.

        Tuned on the first request for ``workload``'s key, cached after.

        Args:
            workload: The calls to time.
            limit: Transitions of the chunk the calls cover (after the memory cap).

        Returns:
            The call size, at most ``limit``.
        """
        tuned = workload.key in self.forward_sizes.found
        if tuned:
            return self.forward_sizes.size(workload.key, limit, lambda size: 0.0)
        begin = time.perf_counter()  # the load check counts as tuning too
        on_cpu = workload.device.type == "cpu"

        def first_calls() -> None:
            # Two calls of one transition: the first calls' costs, not a timing.
            # One intra-op thread on a CPU: a team may wait for taken cores.
            with cpu_load.intra_op_threads(1 if on_cpu else None):
                time_per_transition(workload, 1, limit=limit, transitions=2)

        # The first calls space the load readings (no sleep between them).
        busy = on_cpu and cpu_load.oversubscribed(between=first_calls)
        if not on_cpu:
            first_calls()
        thread_options: List[Optional[int]] = [None]
        if busy and th.get_num_threads() > 1:
            thread_options.insert(0, 1)  # first: a team may wait for taken cores
        epoch = getattr(workload, "epoch_transitions", None)
        timing = functools.partial(
            time_per_transition, workload, limit=limit, busy=busy
        )
        size = self.forward_sizes.size(
            workload.key,
            limit,
            functools.partial(timing, transitions=measurement_transitions(epoch)),
            budget_transitions=(
                None if epoch is None else int(TUNING_BUDGET_EPOCHS * epoch)
            ),
            thread_options=thread_options,
            oversubscribed=busy,
            warm_up=_ran_already,  # the first calls ran between the load readings
        )
        self.seconds += time.perf_counter() - begin
        result = self.forward_sizes.results.get(workload.key)
        if result is None:
            self.log(f"forward_size: {size} transitions per reward-net call")
            return size
        self.log(result.describe())
        return size

    def threads(self, workload: Workload) -> Optional[int]:
        """Intra-op threads the workload's calls were tuned to (``None``: as set)."""
        return self.forward_sizes.threads(workload.key)

    def trial(self, workload: Workload) -> Optional[TuningResult]:
        """The tuning whose thread count is still being tried on steps, if any."""
        result = self.forward_sizes.results.get(workload.key)
        return result if self.thread_trial.pending(result) else None

    def faster_mode(
        self,
        workload: Workload,
        n_transitions: int,
        size: int,
    ) -> Tuple[bool, str]:
        """Whether two passes beat one over the first chunk, and why.

        Timed once per chunk size and call size, within what is left of the
        tuning budget (one pass when nothing is).

        Args:
            workload: The calls to time.
            n_transitions: Transitions of the chunk.
            size: Transitions per call.

        Returns:
            ``(two passes?, the reason, for the plan)``.
        """
        key = (n_transitions, size)
        if key not in self.timings:
            timed = self._pass_timing_transitions(workload, n_transitions, size)
            if timed is None:
                self.timings[key] = (False, float("nan"), float("nan"))
                self.log(
                    "two_pass: not timed, the tuning budget (about one epoch) is "
                    "spent: one pass",
                )
                return False, "tuning budget spent"
            begin = time.perf_counter()
            call, available = workload.sample(timed)
            result = self.forward_sizes.results.get(workload.key)
            busy = result is not None and result.oversubscribed
            with (
                workload.measuring(),
                cpu_load.intra_op_threads(self.threads(workload)),
            ):
                t_one, t_two = time_passes(
                    call,
                    min(timed, available),
                    size,
                    list(workload.params),
                    workload.device,
                    clear_ratio=1.0,  # two passes no faster at all: one pass
                    clock=cpu_load.call_clock(busy),
                )
            self.seconds += time.perf_counter() - begin
            # Two passes do a forward more: only a clear gain is worth it.
            faster = t_two < TWO_PASS_MARGIN * t_one
            self.timings[key] = (faster, t_one, t_two)
            self.log(
                f"two_pass: {t_two:.3g} s vs one pass {t_one:.3g} s over "
                f"{min(timed, available)} transitions in calls of {size} "
                f"(median of up to {REPEATS}): "
                f"{'two passes' if faster else 'one pass'}",
            )
        two_pass, t_one, t_two = self.timings[key]
        if np.isnan(t_one):
            return two_pass, "tuning budget spent"
        return two_pass, f"measured {t_two:.3g} s two-pass vs {t_one:.3g} s one-pass"

    def _pass_timing_transitions(
        self,
        workload: Workload,
        n_transitions: int,
        size: int,
    ) -> Optional[int]:
        """Transitions to time one pass against two over, within the budget.

        ``None`` when what is left of the tuning budget does not cover two calls.
        """
        epoch = getattr(workload, "epoch_transitions", None)
        result = self.forward_sizes.results.get(workload.key)
        if epoch is None or result is None:
            return n_transitions
        per_transition = result.chosen_seconds()
        left = TUNING_BUDGET_EPOCHS * epoch * per_transition - result.seconds
        affordable = int(left / (PASS_TIMING_PASSES * per_transition))
        if affordable < 2 * size:
            return None
        return min(n_transitions, affordable)
