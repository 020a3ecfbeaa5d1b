"""The step plan: how one batch is cut into chunks and reward-net calls.

A :class:`StepPlan` is immutable and complete: the engine runs a step from it
and the chunks the trainer builds from it, and reads nothing else. It is either

* **one pass** in chunks of whole items: runs of consecutive items of the batch
  (:func:`pair_chunks`), each chunk run in calls of ``forward_size``
  transitions; or
* **two passes** in chunks of transitions that may split items: each chunk is one
  reward-net call of at most ``forward_size`` transitions, so that its graph is
  freed before the next call.

Items may have *sides* (a fragment pair has two): the transitions of each side
of a chunk are laid end to end on their own, and calls go to the sides in turn,
call ``k`` of the first side, then call ``k`` of the second, with the same
shapes when the sides are alike. A direction whose gradient is zero in exact
arithmetic (a constant shift of the reward, with equal-length fragments) then
gets mirrored contributions added to each other first, which cancel bit for bit:
exactly 0.0, which AdamW needs (it divides by the gradient's own magnitude).
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np


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
