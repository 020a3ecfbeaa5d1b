"""How many transitions go into one reward-net call: measured, not assumed.

On a CPU convolutions over Atari frames run several times faster in calls of a few
frames than in one large call, while a GPU wants large calls until it is
saturated. :class:`ForwardSizeTuner` times sizes 1, 2, 4, ...;
:class:`ForwardSizes` keeps one result per net architecture, input and device for
the planner that owns it. The search's state and rules are in
:mod:`~imitation_accum.planning.tuning_search`, the timings of calls in
:mod:`~imitation_accum.planning.call_timing`.
"""

import dataclasses
import statistics
import time
from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    List,
    Optional,
    Sequence,
    Tuple,
)

import torch as th
from torch import nn

from imitation_accum.planning import cpu_load
from imitation_accum.planning.call_timing import REPEATS
from imitation_accum.planning.tuning_search import (
    Candidate,
    TimingFunction,
    TuningSearch,
    candidate_order,
)

#: Fewest transitions one forward-size measurement runs (two calls at least):
#: enough for a few calls of small sizes, so that the allocator and caches see
#: what a step does, and cheap enough to repeat.
TUNING_TRANSITIONS = 16


@dataclasses.dataclass
class TuningResult:
    """What a forward-size search measured and chose."""

    size: int
    """The chosen transitions per call."""
    at_limit: bool
    """Whether the choice is the largest size tried (larger may be faster)."""
    threads: Optional[int]
    """Intra-op threads to run the calls with (``None``: unchanged)."""
    timings: Dict[Candidate, List[float]]
    """Seconds per transition measured for each candidate, in order."""
    excluded: Dict[Candidate, str]
    """Candidates set aside as implausible, and why."""
    seconds: float
    """Wall-clock seconds the search took."""
    budget_seconds: Optional[float]
    """The time the search was allowed (``None``: unlimited)."""
    oversubscribed: bool = False
    """Whether the CPU's cores were found taken by other threads."""
    thread_options: Tuple[Optional[int], ...] = (None,)
    """The intra-op thread counts timed."""
    wall_factors: Dict[Optional[int], float] = dataclasses.field(default_factory=dict)
    """Thread counts timed on another clock (the thread's CPU time) -> wall-clock
    seconds per second of it, the median over their timings."""

    def median(self, candidate: Candidate) -> float:
        """The median of ``candidate``'s timings, wall-clock seconds per transition."""
        raw = statistics.median(self.timings[candidate])
        return raw * self.wall_factors.get(candidate[1], 1.0)

    def chosen_seconds(self) -> float:
        """The chosen size's median seconds per transition.

        With the chosen threads where they were timed at that size; the step
        trial may pick a count that was timed only at other sizes.
        """
        chosen = (self.size, self.threads)
        if chosen in self.timings:
            return self.median(chosen)
        return min(self.median(c) for c in self.timings if c[0] == self.size)

    def describe(self) -> str:
        """One line: the choice, the medians measured and the cost."""

        def name(candidate: Candidate) -> str:
            size, threads = candidate
            return f"{size}" if threads is None else f"{size}@{threads}t"

        parts = [
            f"{name(c)}: {self.median(c) * 1e6:.3g} us (x{len(t)})"
            for c, t in sorted(self.timings.items(), key=lambda kv: kv[0][0])
        ]
        threads = "" if self.threads is None else f", {self.threads} intra-op thread(s)"
        budget = (
            "" if self.budget_seconds is None else f" of {self.budget_seconds:.3g} s"
        )
        text = (
            f"forward_size: {self.size} transitions per reward-net call{threads} "
            f"(median time per transition: {', '.join(parts)}; tuning "
            f"{self.seconds:.3g} s{budget}"
        )
        if self.oversubscribed:
            text += "; CPU oversubscribed"
        for count, factor in self.wall_factors.items():
            text += (
                f"; calls at {count or 'the set'} thread(s) timed in CPU time, "
                f"scaled by {factor:.3g} (their median ratio of wall-clock to CPU "
                "time)"
            )
        for candidate, why in self.excluded.items():
            text += f"; {name(candidate)} set aside: {why}"
        return text + ")"


class ForwardSizeTuner:
    """Chooses transitions per reward-net call by timing real calls.

    Sizes 1, 2, 4, ... up to ``max_size`` are scanned in turn, each timed once;
    the scan stops once two sizes in a row are ``stop_ratio`` times slower per
    transition than the best and no faster than the smaller sizes (past the
    optimum: one slow timing is not enough).
    While a call's time grows at most as the square root of its size (from
    the previous size timed: fixed costs dominate, as in an MLP), the scan
    skips every other size, and while that holds again ever more (16, then 256
    times the size); the skipped sizes next to the best are timed after the
    scan. A scan that improved at every size up to ``max_size`` is decided:
    larger calls were faster each time.
    The best sizes and their neighbours are then re-timed, interleaved, in
    alternating order, until each has ``repeats`` timings; their medians decide.
    A timing ``pathological_ratio`` times slower (or faster) per transition than
    its neighbour's is implausible for a net (a call of twice the size does at
    most twice the work), so both are re-timed; a size that stays so is set
    aside as noise. The smallest size within ``tolerance`` of the best wins: on
    a CPU, smaller calls keep each activation within the allocator's reused
    blocks and the caches. An MLP, whose calls are dominated by fixed
    overhead, ends at ``max_size``.

    With several ``thread_options`` every size is timed with each (the CPU is
    shared: fewer threads may be faster), and the pair that is fastest wins.
    With ``budget_transitions`` (one epoch's transitions), the scan stops once a
    third of it is spent, or would be by the next size's timing, unless it
    still improves (a size that does not, after one that did, is re-timed
    before the scan ends), and a size other than the
    best and its neighbours is re-timed only if the timing, as long as its
    last, ends before two thirds are; the best and its neighbours always get
    ``repeats`` timings.

    Args:
        repeats: Timings per candidate near the best (their median counts).
        stop_ratio: A size this much slower per transition than the best counts
            as past the optimum.
        tolerance: Sizes this close to the best count as equally fast.
        pathological_ratio: Neighbouring sizes this far apart are re-timed.
    """

    def __init__(
        self,
        *,
        repeats: int = REPEATS,
        stop_ratio: float = 1.15,
        tolerance: float = 1.02,
        pathological_ratio: float = 10.0,
    ) -> None:
        self.repeats = repeats
        self.stop_ratio = stop_ratio
        self.tolerance = tolerance
        self.pathological_ratio = pathological_ratio
        self.last_result: Optional[TuningResult] = None
        """The last search's measurements."""

    def tune(
        self,
        time_per_transition: TimingFunction,
        max_size: int,
        *,
        budget_transitions: Optional[int] = None,
        thread_options: Sequence[Optional[int]] = (None,),
        oversubscribed: bool = False,
        warm_up: Optional[Callable[[], object]] = None,
    ) -> int:
        """Returns the size with the least time per transition.

        The whole search is kept in :attr:`last_result` (:class:`TuningResult`).

        Args:
            time_per_transition: Runs forward+backward work in calls of the given
                number of transitions and returns the seconds per transition.
                With several ``thread_options`` it is also given ``ceiling=``, a
                time per transition past which it may stop early and return
                what it measured so far. A timing on another clock than the
                wall clock returns a ``tuning_search.ClockedTiming`` (its
                ``ceiling`` is then on that clock too).
            max_size: Largest size to try.
            budget_transitions: The search may take as long as this many
                transitions take at the best size found (one epoch's worth),
                or ``None`` for no limit.
            thread_options: Intra-op thread counts to time each size with
                (``None``: as set), the first timed first and preferred in ties.
            oversubscribed: Recorded in the result (why threads were tried).
            warm_up: Runs the first calls, not counted (default: a timing of
                calls of one transition).

        Returns:
            The chosen number of transitions per call.
        """
        begin = time.perf_counter()
        search = TuningSearch(self, time_per_transition, list(thread_options))
        grid = _doubling_sizes(max_size)

        def budget() -> Optional[float]:
            if budget_transitions is None or not search.usable():
                return None
            return budget_transitions * search.best()

        def spent(share: float = 1.0, then: float = 0.0) -> bool:
            """Whether ``share`` of the budget is spent (``then`` seconds on)."""
            limit = budget()
            elapsed = time.perf_counter() - begin + then
            return limit is not None and elapsed > share * limit

        def improved_before(size: Optional[int], counts: List[Optional[int]]) -> bool:
            """Whether ``size`` (timed before) improved for one of ``counts``."""
            timed = [t for t in counts if (size, t) in search.timings]
            return size is not None and search.improving(size, timed)

        with cpu_load.intra_op_threads(search.thread_options[0]):
            if warm_up is None:
                time_per_transition(1)  # first calls, allocator: not counted
            else:
                warm_up()
        slower_in_a_row = {threads: 0 for threads in search.thread_options}
        index, previous, stride = 0, None, 1
        while index < len(grid):
            size = grid[index]
            scanning = [t for t, n in slower_in_a_row.items() if n < 2]
            for threads in scanning:  # thread options interleaved, size by size
                try:
                    search.measure((size, threads), search.ceiling((size, threads)))
                except th.OutOfMemoryError:
                    if not search.timings:
                        raise
                    scanning = []  # larger calls do not fit: the best so far it is
                    break
                if search.outrun((size, threads)):
                    # Another thread count is far faster at this size: this
                    # one's team waits for taken cores; no more time on it.
                    slower_in_a_row[threads] = 2
                    search.outran.add((size, threads))
                    continue
                search.recheck_if_implausible((size, threads))
                # Past the optimum: slower than the best, and no better than
                # this count's smaller sizes (a count that still improves may
                # pass another at larger sizes: a team of threads on a busy CPU).
                median = search.median((size, threads))
                behind = median > self.stop_ratio * search.best()
                if behind and not search.improving(size, [threads]):
                    slower_in_a_row[threads] += 1
                else:
                    slower_in_a_row[threads] = 0
            # Two sizes in a row past the optimum for every count: the scan
            # ends here (the budget's re-check below would only time again).
            scanning = [t for t in scanning if slower_in_a_row[t] < 2]
            if not scanning:
                break
            # The budget ends a scan that no longer improves once its share is
            # spent, or would be by the next size's timing (taken as slow per
            # transition as this one's: past a cache cliff it is slower still);
            # one that still improves (calls dominated by fixed costs) runs on,
            # each size costing about as much as the last. The scan keeps a
            # share of the budget for re-timing the contenders.
            upcoming = 0.0
            if index + 1 < len(grid):
                this = max(search.last_seconds.get((size, t), 0.0) for t in scanning)
                upcoming = this * grid[index + 1] / size
            if spent(1 / self.repeats, then=upcoming) and not search.improving(
                size, scanning
            ):
                # Re-checked first where the size before it still improved: one
                # noisy timing must not end a scan that halves the time per
                # transition with every doubling. A scan that had flattened
                # ends (the re-check would time its largest calls yet again).
                if not improved_before(previous, scanning):
                    break
                for threads in scanning:
                    search.measure((size, threads))
                if not search.improving(size, scanning):
                    break
            steep = previous is not None and all(
                search.sublinear(previous, size, t) for t in scanning
            )
            previous = size
            # Calls that cost little more as they grow: the stride doubles each
            # time that holds (4x, 16x, 256x the size), so that an MLP reaches
            # its whole chunk in a few timings.
            stride = 2 * stride if steep else 1
            index += stride
            if index >= len(grid) and size != grid[-1]:
                index = len(grid) - 1  # the largest size is always timed
        # A scan that improved at every size up to the largest is decided: it
        # ends there whatever more timings say. Otherwise the sizes it skipped
        # next to the best are timed, then the interleaved re-timing: the
        # contenders until each has `repeats`; the rest where a timing ends
        # before two thirds of the budget, the last third kept for the
        # contenders.
        decided = search.improved_throughout(max_size)
        if not decided:
            search.fill_gaps(grid)
        for round_index in range(1, 1 if decided else self.repeats):
            contenders = search.contenders()
            order = sorted(
                set(contenders) | set(search.near_best()), key=candidate_order
            )
            if round_index % 2:
                order = order[::-1]
            for candidate in order:
                if len(search.timings[candidate]) > round_index:
                    continue
                # Another timing of a size near the best but not next to it
                # must end before two thirds of the budget (as long as its last).
                extra = candidate not in contenders
                if extra and spent(2 / 3, then=search.last_seconds.get(candidate, 0.0)):
                    continue
                search.measure(candidate)
        search.recheck_neighbours()
        size, threads = search.choice()
        self.last_result = TuningResult(
            size=size,
            at_limit=size == max_size,
            threads=threads,
            timings=search.timings,
            excluded=search.excluded,
            seconds=time.perf_counter() - begin,
            budget_seconds=budget(),
            oversubscribed=oversubscribed,
            thread_options=tuple(search.thread_options),
            wall_factors=search.wall_factors(),
        )
        return size


def _doubling_sizes(max_size: int) -> List[int]:
    sizes, size = [], 1
    while size < max_size:
        sizes.append(size)
        size *= 2
    return [*sizes, max(1, max_size)]


class ForwardSizes:
    """Tuned call sizes, one per workload key; owned by a planner.

    Each key (net architecture, input, device, precision) is tuned once, the
    first time it is asked for; later requests reuse the result.

    Args:
        tuner: The search to run on a miss.
    """

    def __init__(self, tuner: Optional[ForwardSizeTuner] = None) -> None:
        self.tuner = tuner or ForwardSizeTuner()
        # key -> (tuned size, whether the search stopped at its size limit)
        self.found: Dict[Hashable, Tuple[int, bool]] = {}
        self.results: Dict[Hashable, TuningResult] = {}
        """key -> the search that tuned it (absent for sizes set from outside)."""

    def size(
        self,
        key: Hashable,
        max_size: int,
        time_per_transition: TimingFunction,
        **search: Any,
    ) -> int:
        """The call size for calls of at most ``max_size`` transitions.

        Args:
            key: Identifies what the timing depends on.
            max_size: Largest size worth trying (transitions in a chunk).
            time_per_transition: See :meth:`ForwardSizeTuner.tune`.
            **search: Further arguments of :meth:`ForwardSizeTuner.tune`.

        Returns:
            The cached or freshly tuned size, at most ``max_size``.
        """
        if key not in self.found:
            self.tuner.last_result = None
            size = self.tuner.tune(time_per_transition, max_size, **search)
            self.found[key] = (size, size == max_size)
            if self.tuner.last_result is not None:
                self.results[key] = self.tuner.last_result
        return self.resolve(self.found[key], max_size)

    def threads(self, key: Hashable) -> Optional[int]:
        """Intra-op threads the calls of ``key`` were tuned to (``None``: as set)."""
        result = self.results.get(key)
        return None if result is None else result.threads

    @staticmethod
    def resolve(found: Tuple[int, bool], max_size: int) -> int:
        """A tuned ``(size, at_limit)`` applied to calls of at most ``max_size``."""
        size, at_limit = found
        # A search that ended at its limit found larger calls ever faster (an MLP,
        # a GPU below saturation): then calls as large as the whole chunk are best.
        return max_size if at_limit else min(size, max_size)


def architecture_key(net: nn.Module, *extra: Hashable) -> Hashable:
    """A cache key for a net's timing: its class, parameter shapes and ``extra``."""
    shapes = tuple(tuple(p.shape) for p in net.parameters())
    return (type(net).__qualname__, shapes, *extra)
