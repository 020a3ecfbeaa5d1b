"""Planning a step: how one batch is cut into chunks and reward-net calls.

Items may have *sides* (a fragment pair has two), each laid end to end on its own;
calls go to the sides in turn with like shapes, so that a direction whose exact
gradient is zero (a constant reward shift) gets contributions that cancel bit for bit.
A plan also names the intra-op threads its calls run with on a CPU
(:mod:`~imitation_accum.planning.threads`). Planning is pure: the trainer runs the
plan, and after an out-of-memory error plans again with :meth:`StepPolicy.backed_off`.
"""

import dataclasses
from typing import List, Optional, Tuple

import numpy as np
import torch as th

from imitation_accum.planning import threads as intra_op


def plan_chunks(n_items: int, minibatch_size: Optional[int]) -> List[slice]:
    """Slices of ``minibatch_size`` (``None``: all) covering ``range(n_items)``."""
    size = n_items if minibatch_size is None else max(1, minibatch_size)
    return [slice(s, min(s + size, n_items)) for s in range(0, n_items, size)]


def pair_chunks(
    item_transitions: np.ndarray,
    *,
    max_items: Optional[int],
    max_transitions: Optional[int],
) -> List[slice]:
    """Slices of consecutive items, at most ``max_items`` and ``max_transitions``.

    ``None`` is no limit; a larger item gets a chunk of its own.
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


def _as_sides(item_transitions: np.ndarray) -> np.ndarray:
    """Item lengths as ``(n_items, n_sides)``: one side unless given more."""
    lengths = np.asarray(item_transitions, dtype=np.int64)
    return lengths.reshape(len(lengths), -1) if lengths.ndim < 2 else lengths


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one step runs: the engine's and the chunk builders' input.

    One pass in chunks of whole items, each side in calls of ``forward_size``, or
    two passes in chunks of one call each that may split items.
    """

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
    largest_call: int = 0
    """Transitions of the step's largest reward-net call."""
    threads: Optional[int] = None
    """Intra-op threads of the step's calls; ``None``: the caller's."""

    @classmethod
    def one_pass(
        cls, lengths: np.ndarray, chunks: List[slice], forward_size: int, reason: str
    ) -> "StepPlan":
        """A plan in ``chunks`` of whole items of ``lengths`` transitions (per side)."""
        sides = _as_sides(lengths)
        sizes = tuple(int(sides[s].sum()) for s in chunks)
        side_sums = [int(n) for s in chunks for n in sides[s].sum(0)]
        calls = sum(-(-n // forward_size) for n in side_sums)
        largest = min(forward_size, max(side_sums, default=0))
        return cls(
            False, forward_size, tuple(chunks), (), sizes, calls, reason, largest
        )

    @classmethod
    def two_passes(
        cls, lengths: np.ndarray, forward_size: int, reason: str
    ) -> "StepPlan":
        """A plan in chunks of one call each: range ``k`` of each side in turn."""
        per_side = [
            plan_chunks(int(n), forward_size) for n in _as_sides(lengths).sum(0)
        ]
        longest = max((len(ranges) for ranges in per_side), default=0)
        chunks = tuple(
            (side, ranges[k].start, ranges[k].stop)
            for k in range(longest)
            for side, ranges in enumerate(per_side)
            if k < len(ranges)
        )
        sizes = tuple(stop - start for _, start, stop in chunks)
        largest = max(sizes, default=0)
        return cls(True, forward_size, (), chunks, sizes, len(chunks), reason, largest)

    @property
    def largest_chunk(self) -> int:
        """Transitions of the largest chunk (0 without items)."""
        return max(self.chunk_transitions, default=0)


@dataclasses.dataclass(frozen=True)
class StepPolicy:
    """How a trainer cuts its steps: plain data, built when ``train()`` runs."""

    minibatch_size: Optional[int] = None
    """Items per one-pass chunk; ``None``: no limit."""
    chunk_cap: Optional[int] = None
    """Units per chunk that fit in memory; ``None``: not limited."""
    forward_size: Optional[int] = None
    """Transitions per reward-net call; ``None``: one call per chunk."""
    two_pass: Optional[bool] = None
    """``None``: two passes only when one item exceeds ``chunk_cap``."""
    unit: str = "transition"
    """What an item's length and the cap count (for messages)."""
    threads: Optional[intra_op.ThreadPolicy] = None
    """Intra-op threads of the calls, by their size; ``None``: the caller's."""

    def planned(self, plan: StepPlan) -> StepPlan:
        """``plan`` with the intra-op threads of its largest call."""
        if self.threads is None:
            return plan
        return dataclasses.replace(
            plan, threads=self.threads.threads(plan.largest_call)
        )

    def forward_size_within(self, limit: int) -> int:
        """Transitions per call for calls over at most ``limit`` transitions."""
        if self.chunk_cap is not None:
            limit = min(limit, self.chunk_cap)
        limit = max(1, limit)
        return limit if self.forward_size is None else min(self.forward_size, limit)

    def backed_off(self, plan: StepPlan, error: BaseException) -> "StepPolicy":
        """This policy with chunks half as large as ``plan``'s (out of memory).

        The caller plans the step again with it and redoes the step (which must
        have left no trace), after releasing the device's cached memory.

        Raises:
            torch.OutOfMemoryError: if the failed chunks held a single unit.
        """
        if plan.largest_chunk <= 1:
            raise th.OutOfMemoryError(
                f"out of memory with chunks of one {self.unit}: the reward net does "
                f"not fit on its device for a single {self.unit} (plus parameters, "
                "gradients and optimizer state). Use a smaller net, "
                "activation_checkpointing=True, autocast_dtype, or a larger device. "
                f"The error was: {error}"
            ) from error
        return dataclasses.replace(self, chunk_cap=plan.largest_chunk // 2)


def _item_chunks(lengths: np.ndarray, policy: StepPolicy) -> Tuple[List[slice], int]:
    """Chunks of whole items within the policy's limits, and the call size."""
    chunks = pair_chunks(
        lengths, max_items=policy.minibatch_size, max_transitions=policy.chunk_cap
    )
    return chunks, policy.forward_size_within(int(lengths[chunks[0]].sum()))


def plan_step(item_transitions: np.ndarray, policy: StepPolicy) -> StepPlan:
    """The plan of a training step; ``item_transitions``: ``(n_items,)`` or per side.

    Raises:
        ValueError: if ``two_pass=False`` but one item exceeds the memory cap.
    """
    sides = _as_sides(item_transitions)
    if not len(sides):
        return StepPlan.one_pass(sides, [], 1, "no items")
    longest, cap, unit = int(sides.sum(1).max()), policy.chunk_cap, policy.unit
    if cap is not None and longest > cap:
        if policy.two_pass is False:
            raise ValueError(
                f"two_pass=False, but an item of {longest} {unit}s exceeds the "
                f"{cap} {unit}s that fit in memory_budget (or the device, after an "
                "out-of-memory error); allow two passes (two_pass=None) or raise "
                "the budget"
            )
        reason = "one item exceeds the memory cap"
        size = policy.forward_size_within(cap)
        return policy.planned(StepPlan.two_passes(sides, size, reason))
    chunks, size = _item_chunks(sides.sum(1), policy)
    if policy.two_pass:
        return policy.planned(StepPlan.two_passes(sides, size, "two_pass=True"))
    return policy.planned(
        StepPlan.one_pass(sides, chunks, size, "chunks of whole items")
    )


def plan_evaluation(item_transitions: np.ndarray, policy: StepPolicy) -> StepPlan:
    """The plan of a no-grad evaluation: chunks of whole items, one pass.

    Without a graph, an item larger than the memory cap needs no second pass.
    """
    sides = _as_sides(item_transitions)
    if not len(sides):
        return StepPlan.one_pass(sides, [], 1, "no items")
    chunks, size = _item_chunks(sides.sum(1), policy)
    return policy.planned(StepPlan.one_pass(sides, chunks, size, "evaluation"))
