"""The state of one forward-size search and the rules that read its timings.

:class:`TuningSearch` holds the timings of each candidate (a call size and an
intra-op thread count) and decides what is usable, near the best, outrun by
another thread count or implausible; :class:`ForwardSizeTuner` drives it.

A timing may come on two clocks (:class:`ClockedTiming`): one-thread calls on a
busy CPU are timed in the thread's CPU time, steady where the wall clock is not,
but a thread count's team of several is timed on the wall clock. The search
compares sizes of one count on its own clock and counts with each other on the
wall clock: a count's medians are scaled by its median ratio of wall to clock
time (:meth:`TuningSearch.wall_factor`), which leaves the comparisons of its
sizes as they were.
"""

import itertools
import statistics
import time
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from imitation_accum.planning import cpu_load

if TYPE_CHECKING:
    from imitation_accum.planning.forward_size import ForwardSizeTuner

#: A thread count this much slower than another at the same size is dropped.
OUTRUN_RATIO = 2.0


class ClockedTiming(NamedTuple):
    """Seconds per transition of one timing, on its clock and on the wall clock."""

    seconds: float
    """On the timing's clock (the thread's CPU time, for instance)."""
    wall_seconds: float
    """On the wall clock, over the same calls."""


#: ``time_per_transition(size)`` or ``time_per_transition(size, ceiling=...)``:
#: seconds per transition of calls of ``size`` (see :meth:`ForwardSizeTuner.tune`),
#: on the wall clock or as a :class:`ClockedTiming`.
TimingFunction = Callable[..., Union[float, ClockedTiming]]
Candidate = Tuple[int, Optional[int]]
"""``(transitions per call, intra-op threads or None for unchanged)``."""


def candidate_order(candidate: Candidate) -> Tuple[int, int]:
    """Sorts candidates by size, then thread count (``None`` first)."""
    return candidate[0], -1 if candidate[1] is None else candidate[1]


class TuningSearch:
    """The timings of one search and the rules that read them."""

    def __init__(
        self,
        tuner: "ForwardSizeTuner",
        time_per_transition: TimingFunction,
        thread_options: List[Optional[int]],
    ) -> None:
        self.tuner = tuner
        self.time_per_transition = time_per_transition
        self.thread_options = thread_options
        self.timings: Dict[Candidate, List[float]] = {}
        self.excluded: Dict[Candidate, str] = {}
        self.outran: Set[Candidate] = set()
        """Candidates far slower than another thread count: not re-timed."""
        self.wall_ratios: Dict[Optional[int], List[float]] = {}
        """Thread count -> wall-clock over clock seconds of its clocked timings."""
        self.last_seconds: Dict[Candidate, float] = {}
        """Wall-clock seconds the last timing of each candidate took."""

    def measure(self, candidate: Candidate, ceiling: Optional[float] = None) -> None:
        """Times ``candidate`` once; see :meth:`ceiling` for ``ceiling``."""
        size, threads = candidate
        begin = time.perf_counter()
        with cpu_load.intra_op_threads(threads):
            if ceiling is None:
                timing = self.time_per_transition(size)
            else:
                # The ceiling is wall-clock time; the timing reads its clock.
                own_clock = ceiling / self.wall_factor(threads)
                timing = self.time_per_transition(size, ceiling=own_clock)
        if isinstance(timing, ClockedTiming):
            ratio = timing.wall_seconds / max(timing.seconds, 1e-12)
            self.wall_ratios.setdefault(threads, []).append(ratio)
            timing = timing.seconds
        self.timings.setdefault(candidate, []).append(timing)
        self.last_seconds[candidate] = time.perf_counter() - begin

    def wall_factor(self, threads: Optional[int]) -> float:
        """Wall-clock seconds per second of ``threads``' clock (1: the wall clock).

        The median ratio over the count's timings: one timing's share of
        preemption depends on where the other jobs' slices fell.
        """
        ratios = self.wall_ratios.get(threads)
        return statistics.median(ratios) if ratios else 1.0

    def wall_factors(self) -> Dict[Optional[int], float]:
        """:meth:`wall_factor` of each thread count timed on another clock."""
        return {threads: self.wall_factor(threads) for threads in self.wall_ratios}

    def ceiling(self, candidate: Candidate) -> Optional[float]:
        """Seconds per transition past which timing ``candidate`` may stop.

        ``OUTRUN_RATIO`` times the best other thread count's at the same size:
        a count that slow is dropped anyway, and on a busy CPU a full timing of
        it can take seconds (a team of threads waiting for taken cores).
        """
        others = [
            self.median(c)
            for c in self.usable()
            if c[0] == candidate[0] and c[1] != candidate[1]
        ]
        return OUTRUN_RATIO * min(others) if others else None

    def median(self, candidate: Candidate) -> float:
        """The median of ``candidate``'s timings, in wall-clock seconds per transition.

        Timings on another clock are scaled by :meth:`wall_factor`.
        """
        raw = statistics.median(self.timings[candidate])
        return raw * self.wall_factor(candidate[1])

    def usable(self) -> List[Candidate]:
        """The candidates timed and not set aside."""
        return [c for c in self.timings if c not in self.excluded]

    def best(self) -> float:
        """The least median of the usable candidates."""
        return min(self.median(c) for c in self.usable())

    def improving(self, size: int, thread_options: Sequence[Optional[int]]) -> bool:
        """Whether ``size`` beats every smaller size for one of ``thread_options``."""
        return any(
            self.median((size, t)) * self.tuner.tolerance < self.previous_best(size, t)
            for t in thread_options
        )

    def previous_best(self, size: int, threads: Optional[int]) -> float:
        """The best median of smaller sizes with ``threads`` (inf if none)."""
        smaller = [c for c in self.usable() if c[1] == threads and c[0] < size]
        return min((self.median(c) for c in smaller), default=float("inf"))

    def sublinear(self, smaller: int, larger: int, threads: Optional[int]) -> bool:
        """Whether calls grew at most as the square root of their size.

        From ``smaller`` to ``larger`` (with ``threads``; false where either is
        not usable): the time per transition still falls steeply, so that
        larger calls cost little more (an MLP on a CPU, a GPU below saturation).
        """
        first, second = (smaller, threads), (larger, threads)
        usable = set(self.usable()) - self.outran
        if first not in usable or second not in usable:
            return False
        growth = (self.median(second) * larger) / (self.median(first) * smaller)
        return growth <= (larger / smaller) ** 0.5

    def fill_gaps(self, grid: Sequence[int]) -> None:
        """Times the sizes of ``grid`` next to each thread count's best, if skipped.

        Only sizes between two timed ones (the scan skipped them, it did not
        end before them); thread counts outrun by another are left alone.
        Repeated while a size so timed becomes the best (at most once per size
        of ``grid``).
        """
        for _ in grid:
            added = False
            for threads in self.thread_options:
                mine = [c for c in self.usable() if c[1] == threads]
                if not mine or any(c in self.outran for c in mine):
                    continue
                largest = max(c[0] for c in mine)
                index = grid.index(min(mine, key=self.median)[0])
                for neighbour in grid[max(0, index - 1) : index + 2]:
                    if neighbour < largest and (neighbour, threads) not in self.timings:
                        self.measure((neighbour, threads))
                        self.recheck_if_implausible((neighbour, threads))
                        added = True
            if not added:
                return

    def improved_throughout(self, max_size: int) -> bool:
        """Whether larger calls were faster at every size timed, up to the last.

        True when the best is at ``max_size`` and every size of its thread count
        beat the next smaller one by more than ``tolerance``.
        """
        if not self.usable():
            return False
        best = min(self.usable(), key=self.median)
        if best[0] != max_size:
            return False
        series = sorted(c for c in self.usable() if c[1] == best[1])
        return all(
            self.median(larger) * self.tuner.tolerance < self.median(smaller)
            for smaller, larger in itertools.pairwise(series)
        )

    def near_best(self) -> List[Candidate]:
        """Candidates within ``stop_ratio`` of the best, and their neighbours."""
        best = self.best()
        close = [
            c for c in self.usable() if self.median(c) <= self.tuner.stop_ratio * best
        ]
        near = {n for c in close for n in self.neighbourhood(c)}
        return sorted(near - self.outran, key=candidate_order)

    def contenders(self) -> List[Candidate]:
        """The best candidate of each thread option and its neighbours.

        Not of a thread option whose best is ``stop_ratio`` times slower than
        another's: on a busy CPU each timing of a heavy net can take seconds.
        """
        chosen = set()
        fastest = self.best() if self.usable() else 0.0
        for threads in self.thread_options:
            mine = [c for c in self.usable() if c[1] == threads]
            if not mine:
                continue
            best = min(mine, key=self.median)
            if self.median(best) <= self.tuner.stop_ratio * fastest:
                chosen.update(self.neighbourhood(best))
        return sorted(chosen - self.outran, key=candidate_order)

    def neighbourhood(self, candidate: Candidate) -> List[Candidate]:
        """``candidate`` and the next smaller and larger sizes of its thread count."""
        same = sorted(c for c in self.usable() if c[1] == candidate[1])
        index = same.index(candidate)
        return same[max(0, index - 1) : index + 2]

    def outrun(self, candidate: Candidate) -> bool:
        """Whether another thread count is ``OUTRUN_RATIO`` times faster at its size."""
        others = [
            self.median(c)
            for c in self.usable()
            if c[0] == candidate[0] and c[1] != candidate[1]
        ]
        return bool(others) and self.median(candidate) > OUTRUN_RATIO * min(others)

    def implausible(self, first: Candidate, second: Candidate) -> bool:
        """Whether two timings are implausibly far apart.

        ``pathological_ratio`` apart for sizes twice apart, and proportionally
        more for sizes further apart (a call ``k`` times larger may cost as
        much as the smaller one, ``k`` times less per transition).
        """
        ratio = self.median(first) / max(self.median(second), 1e-12)
        sizes = sorted((first[0], second[0]))
        spread = max(1.0, sizes[1] / max(sizes[0], 1) / 2)
        limit = self.tuner.pathological_ratio * spread
        return ratio > limit or ratio < 1 / limit

    def recheck_if_implausible(self, candidate: Candidate) -> None:
        """Re-times ``candidate`` and its smaller neighbour if they are far apart."""
        same = sorted(c for c in self.timings if c[1] == candidate[1])
        index = same.index(candidate)
        if index and self.implausible(candidate, same[index - 1]):
            for _ in range(self.tuner.repeats - 1):
                self.measure(same[index - 1])
                self.measure(candidate)

    def recheck_neighbours(self) -> None:
        """Sets aside sizes that stay implausibly slow against a neighbour.

        Candidates outrun by another thread count are dropped already: not
        re-timed (on a busy CPU one timing of them can take a second).
        """
        for threads in self.thread_options:
            same = sorted(
                c for c in self.timings if c[1] == threads and c not in self.outran
            )
            for smaller, larger in itertools.pairwise(same):
                if not self.implausible(smaller, larger):
                    continue
                for _ in range(max(0, self.tuner.repeats - len(self.timings[larger]))):
                    self.measure(smaller)
                    self.measure(larger)
                if self.implausible(smaller, larger):
                    slow = max((smaller, larger), key=self.median)
                    other = larger if slow == smaller else smaller
                    ratio = self.median(slow) / self.median(other)
                    self.excluded[slow] = (
                        f"{ratio:.3g}x slower per transition than size {other[0]}"
                    )

    def choice(self) -> Candidate:
        """The smallest size within ``tolerance`` of the best (ties: first count)."""
        usable = self.usable() or list(self.timings)
        best = min(self.median(c) for c in usable)
        within = [c for c in usable if self.median(c) <= self.tuner.tolerance * best]
        # The smallest size; among thread options, the first.
        default = self.thread_options[0]
        return min(within, key=lambda c: (c[0], c[1] != default))
