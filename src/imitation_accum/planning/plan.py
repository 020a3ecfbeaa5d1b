"""Planning a step: how one batch is cut into chunks and reward-net calls.

A trainer builds a :class:`StepPolicy` from its own attributes each time
``train()`` runs: plain data (items per chunk, the memory cap, transitions per
call, passes). Planning a step is a pure function of the batch's lengths and that
value (:func:`plan_step`); :func:`run_step` runs a step and, after a CUDA
out-of-memory error, returns a new policy with the chunk halved. Nothing here
measures the machine or keeps state.

A :class:`StepPlan` is immutable and complete: the engine runs a step from it
and the chunks the trainer builds from it, and reads nothing else. It is either

* **one pass** in chunks of whole items: runs of consecutive items of the batch
  (:func:`pair_chunks`), each chunk run in calls of ``forward_size``
  transitions; or
* **two passes** in chunks of transitions that may split items: each chunk is one
  reward-net call of at most ``forward_size`` transitions, so that its graph is
  freed before the next call. Chosen when one item alone exceeds the memory cap,
  or when asked for (``two_pass=True``).

Items may have *sides* (a fragment pair has two): the transitions of each side
of a chunk are laid end to end on their own, and calls go to the sides in turn,
call ``k`` of the first side, then call ``k`` of the second, with the same
shapes when the sides are alike. A direction whose gradient is zero in exact
arithmetic (a constant shift of the reward, with equal-length fragments) then
gets mirrored contributions added to each other first, which cancel bit for bit:
exactly 0.0, which AdamW needs (it divides by the gradient's own magnitude).
"""

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np
import torch as th

ResultT = TypeVar("ResultT")


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


def transition_ranges(n_transitions: int, size: int) -> List[Tuple[int, int]]:
    """Consecutive ``[start, stop)`` ranges of ``size`` covering ``n_transitions``."""
    return [
        (start, min(start + size, n_transitions))
        for start in range(0, n_transitions, size)
    ]


def mirrored_ranges(
    side_transitions: Sequence[int],
    size: int,
) -> List[Tuple[int, int, int]]:
    """``(side, start, stop)`` ranges of ``size``, range ``k`` of each side in turn.

    Args:
        side_transitions: Transitions of each side of the batch.
        size: Transitions per range (the last of a side may be shorter).

    Returns:
        Ranges covering every side's transitions, interleaved.
    """
    per_side = [transition_ranges(int(n), size) for n in side_transitions]
    longest = max((len(ranges) for ranges in per_side), default=0)
    return [
        (side, *ranges[k])
        for k in range(longest)
        for side, ranges in enumerate(per_side)
        if k < len(ranges)
    ]


def as_sides(item_transitions: np.ndarray) -> np.ndarray:
    """Item lengths as ``(n_items, n_sides)``: one side unless given more."""
    lengths = np.asarray(item_transitions, dtype=np.int64)
    return lengths.reshape(len(lengths), -1) if lengths.ndim < 2 else lengths


def n_calls(n_transitions: int, forward_size: int) -> int:
    """Reward-net calls needed for ``n_transitions`` in calls of ``forward_size``."""
    return -(-n_transitions // forward_size)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one step runs: what the engine and the chunk builders consume."""

    two_pass: bool
    forward_size: int
    """Transitions per reward-net call; in two-pass also per chunk."""
    item_chunks: Tuple[slice, ...]
    """One pass: the items of each chunk (empty for two passes)."""
    transition_chunks: Tuple[Tuple[int, int, int], ...]
    """Two passes: each chunk's ``(side, start, stop)`` in its side's transitions."""
    chunk_transitions: Tuple[int, ...]
    """Transitions of each chunk."""
    net_calls: int
    """Reward-net calls the step makes (this process's)."""
    reason: str
    """Why this mode (for the log)."""

    @classmethod
    def one_pass(
        cls,
        lengths: np.ndarray,
        chunks: List[slice],
        forward_size: int,
        reason: str,
    ) -> "StepPlan":
        """A plan in chunks of whole items, each side in calls of ``forward_size``.

        Args:
            lengths: Transitions of each item, ``(n_items,)`` or per side
                ``(n_items, n_sides)``.
            chunks: The items of each chunk.
            forward_size: Transitions per call.
            reason: Why this mode.

        Returns:
            The plan.
        """
        sides = as_sides(lengths)
        sizes = tuple(int(sides[s].sum()) for s in chunks)
        calls = sum(
            n_calls(int(n), forward_size) for s in chunks for n in sides[s].sum(0)
        )
        return cls(False, forward_size, tuple(chunks), (), sizes, calls, reason)

    @classmethod
    def two_passes(
        cls,
        lengths: np.ndarray,
        forward_size: int,
        reason: str,
    ) -> "StepPlan":
        """A plan in chunks of one call of ``forward_size`` transitions each.

        Args:
            lengths: Transitions of each item, ``(n_items,)`` or per side.
            forward_size: Transitions per call and chunk.
            reason: Why this mode.

        Returns:
            The plan, with the sides' ranges interleaved.
        """
        side_totals = as_sides(lengths).sum(0)
        ranges = tuple(mirrored_ranges(side_totals, forward_size))
        sizes = tuple(stop - start for _, start, stop in ranges)
        return cls(True, forward_size, (), ranges, sizes, len(ranges), reason)

    @property
    def largest_chunk(self) -> int:
        """Transitions of the largest chunk (0 without items)."""
        return max(self.chunk_transitions, default=0)

    @property
    def n_chunks(self) -> int:
        """Chunks (minibatches) of the step."""
        return len(self.chunk_transitions)


@dataclasses.dataclass(frozen=True)
class StepPolicy:
    """How a trainer cuts its steps: plain data, built when ``train()`` runs."""

    minibatch_size: Optional[int] = None
    """Items per one-pass chunk; ``None``: no limit."""
    chunk_cap: Optional[int] = None
    """Units per chunk that fit in memory (a budget, or out-of-memory back-offs);
    ``None``: not limited."""
    forward_size: Optional[int] = None
    """Transitions per reward-net call; ``None``: one call per chunk."""
    two_pass: Optional[bool] = None
    """``None``: two passes only when one item exceeds ``chunk_cap``."""
    unit: str = "transition"
    """What an item's length and the cap count (for messages)."""

    def call_size(self, limit: int) -> int:
        """Transitions per call for calls over at most ``limit`` transitions."""
        if self.chunk_cap is not None:
            limit = min(limit, self.chunk_cap)
        limit = max(1, limit)
        return limit if self.forward_size is None else min(self.forward_size, limit)

    def backed_off(self, plan: "StepPlan", error: BaseException) -> "StepPolicy":
        """This policy with chunks half as large as ``plan``'s largest.

        Args:
            plan: The plan of a step that ran out of memory.
            error: The out-of-memory error.

        Returns:
            The new policy.

        Raises:
            torch.OutOfMemoryError: if the failed chunks held a single unit.
        """
        if plan.largest_chunk <= 1:
            raise th.OutOfMemoryError(
                f"out of memory with chunks of one {self.unit}: the reward net does "
                f"not fit on its device for a single {self.unit} (plus parameters, "
                "gradients and optimizer state). Use a smaller net, "
                "activation_checkpointing=True, autocast_dtype, or a larger device. "
                f"The error was: {error}",
            ) from error
        return dataclasses.replace(self, chunk_cap=plan.largest_chunk // 2)


def plan_step(item_transitions: np.ndarray, policy: StepPolicy) -> StepPlan:
    """The plan of a training step whose items hold ``item_transitions``.

    Args:
        item_transitions: Transitions per item of (this process's share of) the
            batch, ``(n_items,)``, or per side ``(n_items, n_sides)`` for items
            whose sides are laid out mirrored (fragment pairs).
        policy: The trainer's policy.

    Returns:
        The plan.

    Raises:
        ValueError: if ``two_pass=False`` is pinned but one item exceeds the
            memory cap.
    """
    sides = as_sides(item_transitions)
    if not len(sides):
        return StepPlan.one_pass(sides, [], 1, "no items")
    lengths = sides.sum(1)
    cap, unit = policy.chunk_cap, policy.unit
    fits = cap is None or int(lengths.max()) <= cap
    if not fits and policy.two_pass is False:
        raise ValueError(
            f"two_pass=False, but an item of {int(lengths.max())} {unit}s exceeds "
            f"the {cap} {unit}s that fit in memory_budget (or the device, after an "
            "out-of-memory error); allow two passes (two_pass=None) or raise the "
            "budget",
        )
    if not fits:
        reason = "one item exceeds the memory cap"
        return StepPlan.two_passes(sides, policy.call_size(int(cap or 1)), reason)
    chunks = pair_chunks(lengths, max_items=policy.minibatch_size, max_transitions=cap)
    size = policy.call_size(int(lengths[chunks[0]].sum()))
    if policy.two_pass:
        return StepPlan.two_passes(sides, size, "two_pass=True")
    return StepPlan.one_pass(sides, chunks, size, "chunks of whole items")


def plan_evaluation(item_transitions: np.ndarray, policy: StepPolicy) -> StepPlan:
    """The plan of a no-grad evaluation: chunks of whole items, one pass.

    Without gradient no graph is kept, so an item larger than the memory cap
    needs no second pass: its calls are at most the cap.

    Args:
        item_transitions: Transitions per item.
        policy: The trainer's policy.

    Returns:
        The plan.
    """
    sides = as_sides(item_transitions)
    if not len(sides):
        return StepPlan.one_pass(sides, [], 1, "no items")
    lengths = sides.sum(1)
    chunks = pair_chunks(
        lengths, max_items=policy.minibatch_size, max_transitions=policy.chunk_cap
    )
    size = policy.call_size(int(lengths[chunks[0]].sum()))
    return StepPlan.one_pass(sides, chunks, size, "evaluation")


def run_step(
    item_transitions: np.ndarray,
    step: Callable[[StepPlan], ResultT],
    policy: StepPolicy,
    *,
    device: th.device,
    log: Callable[[str], None],
    evaluation: bool = False,
) -> Tuple[StepPolicy, StepPlan, ResultT]:
    """Plans and runs a step; after out-of-memory, halves the chunk and redoes it.

    ``step`` must leave no trace when it raises (the engine rolls back).

    Args:
        item_transitions: Transitions per item of the batch.
        step: Builds the plan's chunks and runs them.
        policy: The trainer's policy.
        device: Whose cached memory to release before a retry.
        log: Where a back-off is reported.
        evaluation: Plan a no-grad evaluation instead of a training step.

    Returns:
        The policy the step ran with (halved after out-of-memory errors), its
        plan, and what ``step`` returned.

    Raises:
        torch.OutOfMemoryError: if chunks of one unit do not fit.
    """
    plan_of = plan_evaluation if evaluation else plan_step
    while True:
        plan = plan_of(item_transitions, policy)
        try:
            return policy, plan, step(plan)
        except th.OutOfMemoryError as error:
            policy = policy.backed_off(plan, error)
        # Outside the handler: the error's frames (and tensors) are gone.
        if device.type == "cuda":
            th.cuda.empty_cache()
        log(
            "out of memory: step redone with chunks of at most "
            f"{policy.chunk_cap} {policy.unit}s",
        )
