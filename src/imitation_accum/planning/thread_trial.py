"""Which intra-op thread count a busy CPU's steps run with: tried on real steps.

On an oversubscribed CPU the forward-size tuner times the net's calls with each
thread count, but a step also runs many small operations (the loss, the
optimizer), whose thread teams wait for cores as well. :class:`ThreadTrial`
alternates the counts over the first steps (the tuner's choice first) and keeps
the faster in the median of :data:`THREAD_TRIAL_STEPS` steps each, or at once
when one step is :data:`THREAD_TRIAL_CLEAR` times slower than another's. A
count whose calls alone, as the tuner timed them, take longer than a step
already run with another is not tried: it cannot win (a CNN's steps are mostly
its calls, and a step can take seconds).
"""

import statistics
from typing import Callable, Dict, List, Optional

import torch as th

from imitation_accum.planning.forward_size import TuningResult

#: Steps run with each intra-op thread count (real steps, alternated; the
#: median decides).
THREAD_TRIAL_STEPS = 3
#: A thread count whose step is this much slower than the other's loses at once;
#: counts whose calls are this much slower than the fastest are not tried.
THREAD_TRIAL_CLEAR = 2.0


class ThreadTrial:
    """The step trial of one planner: step times per thread count, then the choice.

    Args:
        log: Where the decision is written.
    """

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.step_seconds: Dict[Optional[int], List[float]] = {}
        """Intra-op threads -> seconds per transition of the steps run with them."""
        self.decided = False

    def pending(self, result: Optional[TuningResult]) -> bool:
        """Whether ``result``'s thread count is still to be tried on steps."""
        return (
            result is not None and not self.decided and len(self.options(result)) >= 2
        )

    def next_threads(self, result: TuningResult) -> Optional[int]:
        """The count the next step runs with: the one with the fewest steps so far.

        Ties go to the tuner's choice.
        """
        options = sorted(self.options(result), key=lambda t: t != result.threads)
        return min(options, key=lambda t: len(self.step_seconds.get(t, [])))

    def options(self, result: TuningResult) -> List[Optional[int]]:
        """Thread counts worth trying: calls within ``THREAD_TRIAL_CLEAR`` of the best.

        Without those not yet tried whose calls alone take longer than the
        fastest step run (per transition).
        """
        best = self.call_seconds(result)
        fastest = min(best.values(), default=0.0)
        step = min((min(s) for s in self.step_seconds.values()), default=None)
        return [
            t
            for t in result.thread_options
            if t in best
            and best[t] <= THREAD_TRIAL_CLEAR * fastest
            and (t in self.step_seconds or step is None or best[t] < step)
        ]

    @staticmethod
    def call_seconds(result: TuningResult) -> Dict[Optional[int], float]:
        """Thread count -> its least median seconds per transition of a call."""
        best: Dict[Optional[int], float] = {}
        for candidate in result.timings:
            if candidate in result.excluded:
                continue
            median = result.median(candidate)
            best[candidate[1]] = min(best.get(candidate[1], median), median)
        return best

    def record(
        self,
        result: TuningResult,
        threads: Optional[int],
        seconds: float,
        transitions: int,
    ) -> None:
        """Counts a step over ``transitions`` run with ``threads``; decides if it can.

        Args:
            result: The tuning whose thread count is tried.
            threads: The count the step ran with.
            seconds: The step's wall-clock seconds.
            transitions: The transitions (or rows) its calls ran.
        """
        tried = set(self.options(result))
        self.step_seconds.setdefault(threads, []).append(seconds / max(1, transitions))
        options = self.options(result)
        times = [self.step_seconds.get(t, []) for t in options]
        medians = {t: statistics.median(s) for t, s in self.step_seconds.items()}
        if len(options) >= 2:
            if not all(times):
                return
            clear = max(medians.values()) > THREAD_TRIAL_CLEAR * min(medians.values())
            if not clear and min(len(s) for s in times) < THREAD_TRIAL_STEPS:
                return
        self.decided = True
        result.threads = min(medians, key=lambda t: medians[t])
        parts = ", ".join(
            f"{_count(t)} thread(s): {m * 1e6:.3g} us (x{len(self.step_seconds[t])})"
            for t, m in medians.items()
        )
        dropped = "".join(
            f"; {_count(t)} thread(s) not tried: its calls alone take longer"
            for t in sorted(tried - set(self.step_seconds), key=str)
        )
        self.log(
            f"intra-op threads: {_count(result.threads)} (CPU oversubscribed; "
            f"median step time per transition: {parts}{dropped})",
        )


def _count(threads: Optional[int]) -> int:
    return th.get_num_threads() if threads is None else threads
