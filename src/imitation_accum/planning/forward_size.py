"""How many transitions go into one reward-net call: measured, not assumed.

On a CPU convolutions over Atari frames run several times faster in calls of a few
frames than in one large call, while a GPU wants large calls until it is
saturated. :class:`ForwardSizeTuner` times sizes 1, 2, 4, ...;
:class:`ForwardSizes` keeps one result per net architecture, input and device for
the planner that owns it; :func:`time_passes` times one pass against two.
"""

import dataclasses
import itertools
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
    Set,
    Tuple,
)

import torch as th
from torch import nn

from imitation_accum.engine import observability
from imitation_accum.planning import cpu_load

#: Fewest transitions one forward-size measurement runs (two calls at least):
#: enough for a few calls of small sizes, so that the allocator and caches see
#: what a step does, and cheap enough to repeat.
TUNING_TRANSITIONS = 16
#: Measurements of each timing that count, interleaved (their median counts).
REPEATS = 3
#: A thread count this much slower than another at the same size is dropped.
OUTRUN_RATIO = 2.0

#: ``time_per_transition(size)`` or ``time_per_transition(size, ceiling=...)``:
#: seconds per transition of calls of ``size`` (see :meth:`ForwardSizeTuner.tune`).
TimingFunction = Callable[..., float]
Candidate = Tuple[int, Optional[int]]
"""``(transitions per call, intra-op threads or None for unchanged)``."""


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

    def median(self, candidate: Candidate) -> float:
        """The median seconds per transition of ``candidate``."""
        return statistics.median(self.timings[candidate])

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
        for candidate, why in self.excluded.items():
            text += f"; {name(candidate)} set aside: {why}"
        return text + ")"


class ForwardSizeTuner:
    """Chooses transitions per reward-net call by timing real calls.

    Sizes 1, 2, 4, ... up to ``max_size`` are scanned in turn, each timed once;
    the scan stops once two sizes in a row are ``stop_ratio`` times slower per
    transition than the best (past the optimum: one slow timing is not enough).
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
    With ``budget_transitions`` (one epoch's transitions), the scan and re-timing of
    sizes far from the best stop once it is spent; the best and its
    neighbours always get ``repeats`` timings.

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
    ) -> int:
        """Returns the size with the least time per transition.

        The whole search is kept in :attr:`last_result` (:class:`TuningResult`).

        Args:
            time_per_transition: Runs forward+backward work in calls of the given
                number of transitions and returns the seconds per transition.
                With several ``thread_options`` it is also given ``ceiling=``, a
                time per transition past which it may stop early and return
                what it measured so far.
            max_size: Largest size to try.
            budget_transitions: The search may take as long as this many
                transitions take at the best size found (one epoch's worth),
                or ``None`` for no limit.
            thread_options: Intra-op thread counts to time each size with
                (``None``: as set), the first timed first and preferred in ties.
            oversubscribed: Recorded in the result (why threads were tried).

        Returns:
            The chosen number of transitions per call.
        """
        begin = time.perf_counter()
        search = _Search(self, time_per_transition, list(thread_options))
        sizes = _doubling_sizes(max_size)

        def budget() -> Optional[float]:
            if budget_transitions is None or not search.usable():
                return None
            return budget_transitions * search.best()

        def spent(share: float = 1.0) -> bool:
            limit = budget()
            return limit is not None and time.perf_counter() - begin > share * limit

        with cpu_load.intra_op_threads(search.thread_options[0]):
            time_per_transition(1)  # warm-up (first calls, allocator): not counted
        slower_in_a_row = {threads: 0 for threads in search.thread_options}
        for size in sizes:
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
                if search.median((size, threads)) > self.stop_ratio * search.best():
                    slower_in_a_row[threads] += 1
                else:
                    slower_in_a_row[threads] = 0
            if not scanning:
                break
            # The budget ends a scan that no longer improves; one that still
            # does (calls dominated by fixed costs) runs on, each size costing
            # about as much as the last. The scan keeps a share of the budget
            # for re-timing the contenders.
            if spent(1 / self.repeats) and not search.improving(size, scanning):
                # Re-checked first: one noisy timing must not end a scan that
                # halves the time per transition with every doubling.
                for threads in scanning:
                    search.measure((size, threads))
                if not search.improving(size, scanning):
                    break
        # Interleaved re-timing: the contenders until each has `repeats`; the
        # rest while the budget lasts.
        for round_index in range(1, self.repeats):
            order = search.contenders()
            if not spent():
                order = sorted(set(order) | set(search.near_best()), key=_order)
            if round_index % 2:
                order = order[::-1]
            for candidate in order:
                if len(search.timings[candidate]) <= round_index:
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
        )
        return size


def _order(candidate: Candidate) -> Tuple[int, int]:
    return candidate[0], -1 if candidate[1] is None else candidate[1]


def _doubling_sizes(max_size: int) -> List[int]:
    sizes, size = [], 1
    while size < max_size:
        sizes.append(size)
        size *= 2
    return [*sizes, max(1, max_size)]


class _Search:
    """The timings of one search and the rules that read them."""

    def __init__(
        self,
        tuner: ForwardSizeTuner,
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

    def measure(self, candidate: Candidate, ceiling: Optional[float] = None) -> None:
        """Times ``candidate`` once; see :meth:`ceiling` for ``ceiling``."""
        size, threads = candidate
        with cpu_load.intra_op_threads(threads):
            if ceiling is None:
                seconds = self.time_per_transition(size)
            else:
                seconds = self.time_per_transition(size, ceiling=ceiling)
        self.timings.setdefault(candidate, []).append(seconds)

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
        return statistics.median(self.timings[candidate])

    def usable(self) -> List[Candidate]:
        return [c for c in self.timings if c not in self.excluded]

    def best(self) -> float:
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

    def near_best(self) -> List[Candidate]:
        """Candidates within ``stop_ratio`` of the best, and their neighbours."""
        best = self.best()
        close = [
            c for c in self.usable() if self.median(c) <= self.tuner.stop_ratio * best
        ]
        near = {n for c in close for n in self.neighbourhood(c)}
        return sorted(near - self.outran, key=_order)

    def contenders(self) -> List[Candidate]:
        """The best candidate of each thread option and its neighbours."""
        chosen = set()
        for threads in self.thread_options:
            mine = [c for c in self.usable() if c[1] == threads]
            if mine:
                best = min(mine, key=self.median)
                chosen.update(self.neighbourhood(best))
        return sorted(chosen - self.outran, key=_order)

    def neighbourhood(self, candidate: Candidate) -> List[Candidate]:
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
        ratio = self.median(first) / max(self.median(second), 1e-12)
        limit = self.tuner.pathological_ratio
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
        """Sets aside sizes that stay implausibly slow against a neighbour."""
        for threads in self.thread_options:
            same = sorted(c for c in self.timings if c[1] == threads)
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
        usable = self.usable() or list(self.timings)
        best = min(self.median(c) for c in usable)
        within = [c for c in usable if self.median(c) <= self.tuner.tolerance * best]
        # The smallest size; among thread options, the first.
        default = self.thread_options[0]
        return min(within, key=lambda c: (c[0], c[1] != default))


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


def time_passes(
    call: Callable[[int, int], th.Tensor],
    n_transitions: int,
    forward_size: int,
    params: List[th.Tensor],
    device: th.device,
    repeats: int = REPEATS,
    clear_ratio: Optional[float] = None,
) -> Tuple[float, float]:
    """Seconds of one pass and of two passes over ``n_transitions``.

    One pass: every call of ``forward_size`` transitions with gradient, then one
    backward of them all. Two passes: every call without gradient, then every
    call again with gradient and its backward at once. ``.grad`` is not touched.

    Args:
        call: Runs one reward-net call on transitions ``[start, stop)``.
        n_transitions: Transitions to run.
        forward_size: Transitions per call.
        params: Parameters to differentiate with respect to.
        device: Where the work runs.
        repeats: Timings of each, interleaved (the median counts).
        clear_ratio: After the first timing of each, stop if two passes took at
            least this many times one pass's time (the answer is clear then).

    Returns:
        ``(one-pass seconds, two-pass seconds)``.
    """
    bounds = [
        (start, min(start + forward_size, n_transitions))
        for start in range(0, n_transitions, forward_size)
    ]
    wanted = [p for p in params if p.requires_grad]

    def two_passes() -> None:
        with th.no_grad():
            for start, stop in bounds:
                call(start, stop)
        for start, stop in bounds:
            th.autograd.grad(call(start, stop).float().sum(), wanted, allow_unused=True)

    def one_pass() -> None:
        outputs = th.cat([call(start, stop) for start, stop in bounds])
        th.autograd.grad(outputs.float().sum(), wanted, allow_unused=True)

    seconds: Dict[Callable[[], None], List[float]] = {two_passes: [], one_pass: []}
    for index in range(repeats):  # interleaved, alternating which goes first
        runs = list(seconds) if index % 2 == 0 else list(seconds)[::-1]
        for run in runs:
            observability.synchronize(device)
            begin = time.perf_counter()
            run()
            observability.synchronize(device)
            seconds[run].append(time.perf_counter() - begin)
        if (
            index == 0
            and clear_ratio is not None
            and seconds[two_passes][0] >= clear_ratio * seconds[one_pass][0]
        ):
            break
    return statistics.median(seconds[one_pass]), statistics.median(seconds[two_passes])


def time_forward_backward(
    run: Callable[[], th.Tensor],
    params: List[th.Tensor],
    device: th.device,
) -> float:
    """Seconds for ``run()`` and a backward of its sum, without touching ``.grad``.

    Args:
        run: Computes outputs that depend on ``params``.
        params: Parameters to differentiate with respect to.
        device: Where the work runs (synchronized around the timing).

    Returns:
        Elapsed wall-clock seconds.
    """
    observability.synchronize(device)
    start = time.perf_counter()
    outputs = run()
    wanted = [p for p in params if p.requires_grad]
    th.autograd.grad(outputs.sum(), wanted, allow_unused=True)
    observability.synchronize(device)
    return time.perf_counter() - start
