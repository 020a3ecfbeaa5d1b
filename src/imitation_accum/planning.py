"""The planner: chunks of a batch, transitions per reward-net call, two-pass.

One planner (:class:`ChunkPlanner`) takes ``minibatch_size``, the chunk cap that a
``memory_budget`` gives (in transitions) and ``forward_size``, and decides per step:

* **one pass** in chunks of whole items: runs of consecutive items of the batch,
  at most ``minibatch_size`` items and at most the cap's transitions each (the last
  possibly shorter); or
* **two passes** in chunks of transitions that may split items (see
  :mod:`imitation_accum.accumulation`): when one item alone exceeds the cap
  (*memory*), when asked to (``two_pass=True``), or when it is *faster*. Each
  two-pass chunk is one reward-net call of ``forward_size`` transitions (at most
  the cap), so its graph is freed before the next call.

The number of transitions per reward-net call, ``forward_size``, is measured rather
than assumed: on a CPU convolutions over Atari frames run several times faster in
calls of a few frames than in one large call, while a GPU wants large calls until
it is saturated. When calls are smaller than a chunk, one pass keeps the graphs of
all of a chunk's calls alive until its backward, and two passes free each call's
graph at once at the price of one more forward without gradient; which is faster
depends on the machine, so with ``forward_size="auto"`` the planner times both on
the first chunk of the first batch (:func:`time_passes`), chooses the faster and
logs the choice (``two_pass=False`` or ``True`` pins it).
"""

import dataclasses
import time
from typing import Callable, Dict, Hashable, List, Optional, Tuple, Union

import numpy as np
import torch as th
from torch import nn

from imitation_accum import memory, observability


def plan_chunks(n_items: int, minibatch_size: Optional[int]) -> List[slice]:
    """Cuts ``n_items`` consecutive items into chunks of ``minibatch_size``.

    Args:
        n_items: Items in the batch.
        minibatch_size: Items per chunk; ``None`` means one chunk.

    Returns:
        Slices covering ``range(n_items)`` in order.
    """
    size = n_items if minibatch_size is None else max(1, minibatch_size)
    return [slice(s, min(s + size, n_items)) for s in range(0, n_items, size)]


def pair_chunks(
    item_transitions: np.ndarray,
    *,
    max_items: Optional[int],
    max_transitions: Optional[int],
) -> List[slice]:
    """Cuts consecutive items into chunks of limited items and transitions.

    Args:
        item_transitions: Transitions of each item of the batch, in order.
        max_items: Items per chunk; ``None`` for no limit.
        max_transitions: Transitions per chunk; ``None`` for no limit. An item
            larger than this gets a chunk of its own.

    Returns:
        Slices covering every item in order.
    """
    if max_transitions is None:
        return plan_chunks(len(item_transitions), max_items)
    chunks: List[slice] = []
    start, total = 0, 0
    for index, n in enumerate(item_transitions):
        full = max_items is not None and index - start >= max_items
        if index > start and (full or total + n > max_transitions):
            chunks.append(slice(start, index))
            start, total = index, 0
        total += int(n)
    if len(item_transitions):
        chunks.append(slice(start, len(item_transitions)))
    return chunks


#: Transitions each forward-size measurement runs (fewer in smaller chunks): a
#: one-pass chunk's worth, so that the allocator and caches see what a step does.
TUNING_TRANSITIONS = 256
#: Measurements longer than this (seconds) are not repeated.
LONG_MEASUREMENT_SECONDS = 0.5

#: Two passes are chosen for speed only if they take under this share of one pass.
TWO_PASS_MARGIN = 0.9


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one step runs."""

    two_pass: bool
    forward_size: int
    """Transitions per reward-net call; in two-pass also per chunk."""
    item_chunks: List[slice]
    """One pass: the items of each chunk (empty for two passes)."""
    reason: str
    """Why this mode (for the log)."""

    def largest_chunk(self, item_transitions: np.ndarray) -> int:
        """Transitions of the largest chunk of this plan."""
        if self.two_pass:
            return min(self.forward_size, int(np.sum(item_transitions)))
        return max(int(np.sum(item_transitions[s])) for s in self.item_chunks)


class ChunkPlanner:
    """Decides each step's chunks, reward-net call size and pass count.

    Args:
        minibatch_size: Items per one-pass chunk, or ``None``.
        forward_size: Transitions per reward-net call, or ``"auto"``.
        two_pass: ``None`` to decide (memory, then speed), or pinned.
        max_transitions: Transitions per chunk that fit in memory, or ``None``;
            set from a memory budget and lowered by :meth:`back_off`.
    """

    def __init__(
        self,
        *,
        minibatch_size: Optional[int],
        forward_size: Union[int, str],
        two_pass: Optional[bool] = None,
        max_transitions: Optional[int] = None,
    ) -> None:
        self.minibatch_size = minibatch_size
        self.forward_size = forward_size
        self.two_pass = two_pass
        self.max_transitions = max_transitions
        # (one-pass chunk transitions, forward size) -> (two-pass?, t_one, t_two)
        self.timings: Dict[Tuple[int, int], Tuple[bool, float, float]] = {}

    def plan(
        self,
        item_transitions: np.ndarray,
        *,
        tune_forward_size: Callable[[int], int],
        time_passes: Optional[Callable[[slice, int], Tuple[float, float]]] = None,
    ) -> StepPlan:
        """The plan for a batch whose items hold ``item_transitions``.

        Args:
            item_transitions: Transitions per item of (this process's share of)
                the batch.
            tune_forward_size: Returns the call size to use for calls of at most
                the given number of transitions.
            time_passes: Seconds of one pass and of two passes over the given
                one-pass chunk in calls of the given size; ``None`` never times.

        Returns:
            The plan.

        Raises:
            ValueError: if ``two_pass=False`` is pinned but one item exceeds the
                memory cap.
        """
        lengths = np.asarray(item_transitions)
        if not len(lengths):
            return StepPlan(False, 1, [], "no items")
        cap = self.max_transitions
        fits = cap is None or int(lengths.max()) <= cap
        if not fits and self.two_pass is False:
            raise ValueError(
                f"two_pass=False, but an item of {int(lengths.max())} transitions "
                f"exceeds the {cap} transitions that fit in memory_budget (or the "
                "device, after an out-of-memory error); allow two passes "
                "(two_pass=None) or raise the budget",
            )
        chunks = (
            pair_chunks(lengths, max_items=self.minibatch_size, max_transitions=cap)
            if fits
            else []
        )
        first = int(lengths[chunks[0]].sum()) if fits else int(cap or 1)
        size = tune_forward_size(first)
        if self.two_pass is True:
            two_pass, reason = True, "two_pass=True"
        elif not fits:
            two_pass, reason = True, "one item exceeds the memory cap"
        elif (
            self.two_pass is None
            and self.forward_size == "auto"
            and size < first
            and time_passes is not None
        ):
            key = (first, size)
            if key not in self.timings:
                t_one, t_two = time_passes(chunks[0], size)
                # Two passes do a forward more: only a clear gain is worth it.
                faster = t_two < TWO_PASS_MARGIN * t_one
                self.timings[key] = (faster, t_one, t_two)
            two_pass, t_one, t_two = self.timings[key]
            reason = f"measured {t_two:.3g} s two-pass vs {t_one:.3g} s one-pass"
        else:
            two_pass, reason = False, "calls span whole chunks"
        if two_pass:
            return StepPlan(True, min(size, cap) if cap else size, [], reason)
        return StepPlan(False, size, chunks, reason)

    def back_off(
        self,
        plan: StepPlan,
        item_transitions: np.ndarray,
        error: BaseException,
    ) -> int:
        """Halves the chunk after an out-of-memory error in a step run by ``plan``.

        Args:
            plan: The plan of the failed step.
            item_transitions: The items of the failed step's batch.
            error: The out-of-memory error.

        Returns:
            The new cap, in transitions.

        Raises:
            torch.OutOfMemoryError: if the failed chunks held one transition.
        """
        largest = plan.largest_chunk(np.asarray(item_transitions))
        self.max_transitions = memory.halved_chunk(largest, error)
        return self.max_transitions


def n_calls(n_transitions: int, forward_size: int) -> int:
    """Reward-net calls needed for ``n_transitions`` in calls of ``forward_size``."""
    return -(-n_transitions // forward_size)


class ForwardSizeTuner:
    """Chooses transitions per reward-net call by timing real calls.

    Sizes 1, 2, 4, ... are tried in turn, each timed as the best of ``repeats``
    measurements of the time per transition; the search stops once a size is
    ``stop_ratio`` times slower than the best seen (past the optimum) or at
    ``max_size``. The smallest size within ``tolerance`` of the best wins: on a
    CPU, smaller calls keep each activation within the allocator's reused blocks
    and the caches. An MLP, whose calls are dominated by fixed overhead, ends at
    ``max_size``.

    Args:
        repeats: Measurements per size (the fastest counts).
        stop_ratio: Stop when a size is this much slower per transition than the
            best so far.
        tolerance: Sizes this close to the best count as equally fast.
    """

    def __init__(
        self,
        *,
        repeats: int = 3,
        stop_ratio: float = 1.15,
        tolerance: float = 1.05,
    ) -> None:
        self.repeats = repeats
        self.stop_ratio = stop_ratio
        self.tolerance = tolerance

    def tune(self, time_per_transition: Callable[[int], float], max_size: int) -> int:
        """Returns the size with the least time per transition.

        Args:
            time_per_transition: Runs forward+backward work in calls of the given
                number of transitions and returns the seconds per transition.
            max_size: Largest size to try.

        Returns:
            The chosen number of transitions per call.
        """
        times: Dict[int, float] = {}
        size = 1
        while True:
            size = min(size, max_size)
            try:
                per_transition = self._measure(time_per_transition, size)
            except th.OutOfMemoryError:
                if not times:
                    raise
                break  # larger calls do not fit: the best so far it is
            times[size] = per_transition
            if per_transition > self.stop_ratio * min(times.values()):
                break
            if size == max_size:
                break
            size *= 2
        best = min(times.values())
        return min(s for s, t in times.items() if t <= self.tolerance * best)

    def _measure(self, time_per_transition: Callable[[int], float], size: int) -> float:
        first = time_per_transition(size)
        if first * max(size, TUNING_TRANSITIONS) > LONG_MEASUREMENT_SECONDS:
            # A long measurement averages itself; repeating it costs seconds.
            return first
        return min(
            [first] + [time_per_transition(size) for _ in range(self.repeats - 1)]
        )


# key -> (tuned size, whether the search stopped at its size limit)
_TUNED: Dict[Hashable, Tuple[int, bool]] = {}


def tuned_forward_size(
    key: Hashable,
    max_size: int,
    time_per_transition: Callable[[int], float],
    tuner: Optional[ForwardSizeTuner] = None,
) -> int:
    """Tunes once per process for each ``key`` (net architecture, input, device).

    Args:
        key: Identifies what the timing depends on.
        max_size: Largest size worth trying (transitions in a chunk).
        time_per_transition: See :meth:`ForwardSizeTuner.tune`.
        tuner: The tuner to use on a cache miss.

    Returns:
        The cached or freshly tuned size, at most ``max_size``.
    """
    if key not in _TUNED:
        size = (tuner or ForwardSizeTuner()).tune(time_per_transition, max_size)
        _TUNED[key] = (size, size == max_size)
    size, at_limit = _TUNED[key]
    # A search that ended at its limit found larger calls ever faster (an MLP, a
    # GPU below saturation): then calls as large as the whole chunk are best.
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
    repeats: int = 2,
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
        repeats: Timings of each (the fastest counts).

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

    seconds = {two_passes: float("inf"), one_pass: float("inf")}
    for _ in range(repeats):  # interleaved, the fastest of each counts
        for run in seconds:
            observability.synchronize(device)
            begin = time.perf_counter()
            run()
            observability.synchronize(device)
            seconds[run] = min(seconds[run], time.perf_counter() - begin)
    return seconds[one_pass], seconds[two_passes]


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
