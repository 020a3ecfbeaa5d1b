"""Chunks of fragment pairs: what one reward-net pass of a step reads.

A :class:`PairChunk` holds consecutive pairs of a batch, each side's fragments
laid end to end; a :class:`TransitionChunk` is a range of transitions of one side
of a whole batch (a two-pass plan, whose ranges may split fragments).
:func:`make_chunks` cuts a batch as the planner's plan says.
"""

import dataclasses
from typing import TYPE_CHECKING, List, Optional, Tuple, Union

import numpy as np
import torch as th

from imitation_accum.engine import staging
from imitation_accum.planning.plan import StepPlan
from imitation_accum.preference import fragments, pair_table

if TYPE_CHECKING:
    from imitation_accum.preference.pair_task import PreferenceTask


@dataclasses.dataclass
class StagedSide:
    """One side's converted net inputs for a chunk (views of the batch's)."""

    inputs: Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]
    """``(state, action, next_state, done)``, one row per transition."""


@dataclasses.dataclass
class PairChunk:
    """Consecutive fragment pairs of a batch, ready for the reward net."""

    layouts: Tuple[fragments.FragmentLayout, fragments.FragmentLayout]
    """Fragments ``[a0, a1, ...]`` and ``[b0, b1, ...]``, each laid end to end."""
    preferences: th.Tensor
    """Probability that fragment ``a_i`` is preferred, on the net's device."""
    prefers_first: th.Tensor
    """Whether ``a_i`` is the preferred one (preference above 0.5)."""
    discounts: Tuple[Optional[th.Tensor], Optional[th.Tensor]]
    """Per-transition discount weights of each side (``None`` for a discount of 1)."""
    staged: Optional[Tuple[StagedSide, StagedSide]] = None
    """Each side's inputs for this chunk: views of the batch's, converted once."""

    @property
    def n_pairs(self) -> int:
        """Pairs in the chunk."""
        return len(self.preferences)


@dataclasses.dataclass
class TransitionChunk:
    """Transitions ``[start, stop)`` of one side of a whole batch (two-pass)."""

    batch: PairChunk
    """Every pair of the batch (this process's share of it), laid out."""
    side: int
    """0: the first fragments, 1: the second."""
    start: int
    stop: int

    @property
    def n_transitions(self) -> int:
        """Transitions in the chunk."""
        return self.stop - self.start


def transition_rows(
    offsets: np.ndarray,
    items: np.ndarray,
    lengths: np.ndarray,
) -> np.ndarray:
    """Rows of fragments ``items`` (of ``lengths``) in a layout with ``offsets``."""
    starts = offsets[items]
    before = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) + np.repeat(starts - before, lengths)


def sub_layout(
    layout: fragments.FragmentLayout,
    items: slice,
) -> fragments.FragmentLayout:
    """Fragments ``items`` of ``layout``, laid out on their own (no copy of data)."""
    start = int(layout.offsets[items.start])
    stop = int(layout.offsets[items.stop])
    lengths = layout.lengths[items]
    return fragments.FragmentLayout(
        layout.fragments[items],
        layout.offsets[items.start : items.stop + 1] - start,
        layout.dones[start:stop],
        lengths,
        layout.uniform_length
        if layout.uniform_length is not None or not len(lengths)
        else (int(lengths[0]) if (lengths == lengths[0]).all() else None),
    )


def make_chunks(
    task: "PreferenceTask",
    table: pair_table.PreferenceTable,
    local: np.ndarray,
    plan: StepPlan,
) -> List[Union[PairChunk, TransitionChunk]]:
    """The chunks of pairs ``local`` of ``table`` that ``plan`` lays out.

    Args:
        task: Lays pairs out for the reward net.
        table: The dataset.
        local: The pairs of the batch (this process's share), in order.
        plan: The planner's plan for them.

    Returns:
        Chunks of whole pairs (one pass) or of transition ranges (two passes).
    """
    if not len(local):
        return []
    chunks: List[Union[PairChunk, TransitionChunk]]
    if plan.two_pass:
        batch = task.make_chunk(table, local)
        chunks = [
            TransitionChunk(batch, side, start, stop)
            for side, start, stop in plan.transition_chunks
        ]
    elif task.stager is None and task.staged.applies(table, local):
        # Converted once for the batch, already on the device: nothing to stage.
        return list(task.staged.chunks(table, local, plan.item_chunks))
    else:
        chunks = [task.make_chunk(table, local[s]) for s in plan.item_chunks]
    if task.stager is not None:  # inputs move a chunk ahead (engine.staging)
        next_obs = task.inputs.reads_next_state
        task.stager.schedule(chunks, _ranges, task.device, next_obs=next_obs)
    return chunks


def _ranges(chunk: Union[PairChunk, TransitionChunk]) -> staging.Ranges:
    if isinstance(chunk, TransitionChunk):
        return [(chunk.batch.layouts[chunk.side], chunk.start, chunk.stop)]
    return [(layout, 0, layout.n_transitions) for layout in chunk.layouts]
