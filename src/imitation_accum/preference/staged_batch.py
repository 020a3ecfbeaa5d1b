"""Batches of small reward-net inputs, converted once and split into chunks.

For a net whose converted inputs are small (an MLP's), gathering and converting
them per call would cost more than the call. When the whole dataset's converted
inputs are small they are converted once per ``train()`` call, the first
fragments' transitions then the second's; each step gathers its batch's rows
with one index and splits them into its chunks' views, one operation per
tensor. Where each chunk's transitions go (its layouts and discount weights)
depends only on the pairs' lengths and terminal flags and on the chunks'
bounds, so it is cached: batches of equal-length fragments share one.
"""

from typing import (
    TYPE_CHECKING,
    Dict,
    Hashable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np
import torch as th

from imitation_accum.preference import fragments, pair_table
from imitation_accum.preference.pair_chunks import (
    PairChunk,
    StagedSide,
    sub_layout,
    transition_rows,
)

if TYPE_CHECKING:
    from imitation_accum.preference.pair_task import PreferenceTask

#: A one-pass batch whose converted reward-net inputs take at most this many
#: bytes is gathered and converted once per step, its chunks' calls slicing it
#: (small inputs, such as an MLP's: per-call gathering would cost more than
#: the call).
STAGED_INPUT_BYTES = 4 * 2**20
#: A dataset whose converted inputs take at most this many bytes is converted
#: once per ``train()`` call; each step then indexes the rows of its batch.
STAGED_TABLE_BYTES = 16 * 2**20

#: Chunk placements kept (see ``StagedBatches._placement``): batches of
#: equal-length fragments share one.
PLACEMENTS_CACHED = 64

Inputs = Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]


class _Placement(NamedTuple):
    """Where a batch's transitions go, chunk by chunk (see ``_placement``)."""

    layouts: Tuple[fragments.FragmentLayout, ...]
    """Each side's fragments, laid end to end (without the fragments)."""
    side_sizes: List[List[int]]
    """Per side, the transitions of each chunk."""
    pair_counts: List[int]
    """Pairs per chunk."""
    chunk_layouts: List[Tuple[fragments.FragmentLayout, fragments.FragmentLayout]]
    chunk_discounts: List[Tuple[Optional[th.Tensor], Optional[th.Tensor]]]


class StagedBatches:
    """The converted inputs of a task's batches, and their chunks.

    Args:
        task: Converts inputs and lays pairs out for the reward net.
    """

    def __init__(self, task: "PreferenceTask") -> None:
        self.task = task
        self._staged_table: Optional[tuple] = None
        self._placements: Dict[Hashable, _Placement] = {}

    def applies(self, table: pair_table.PreferenceTable, local: np.ndarray) -> bool:
        """Whether the inputs of pairs ``local`` are converted once for the batch.

        Only for the net's stock ``preprocess`` (row by row, so that slicing its
        output equals converting the slice) and inputs of at most
        :data:`STAGED_INPUT_BYTES`.
        """
        if getattr(self.task.inputs, "_owner", None) is None or not len(local):
            return False
        n_transitions = int(table.lengths[local].sum())
        return n_transitions * self._input_bytes(table) <= STAGED_INPUT_BYTES

    def _input_bytes(self, table: pair_table.PreferenceTable) -> int:
        """Bytes of one transition's converted inputs (float32 observations)."""
        frame: np.ndarray = table.pairs[0][0].obs  # type: ignore[assignment]
        width = int(np.prod(frame.shape[1:])) * 4
        return width * (2 if self.task.inputs.reads_next_state else 1)

    def _chunk_inputs(
        self,
        table: pair_table.PreferenceTable,
        local: np.ndarray,
        layouts: Sequence[fragments.FragmentLayout],
        side_sizes: Sequence[List[int]],
    ) -> List[List[Inputs]]:
        """Each side's converted inputs of pairs ``local``, cut into chunks.

        Args:
            table: The dataset.
            local: The pairs of the batch, in order.
            layouts: Each side's fragments of ``local``, laid end to end.
            side_sizes: Per side, the transitions of each chunk.

        Returns:
            Per side, per chunk, views of the inputs in layout order.
        """
        staged = self._table_inputs(table)
        if staged is None:
            return [
                _split_views(self.task.convert(layout, 0, layout.n_transitions), sizes)
                for layout, sizes in zip(layouts, side_sizes)
            ]
        # Both sides in one gather and one split per tensor.
        table_inputs, offsets = staged
        rows = np.concatenate(
            [
                transition_rows(offsets[side], local, table.lengths[local, side])
                for side in (0, 1)
            ]
        )
        index = th.as_tensor(rows, device=self.task.device)
        picked: Dict[int, th.Tensor] = {}  # next_state may be state itself
        for tensor in table_inputs:
            if id(tensor) not in picked:
                picked[id(tensor)] = tensor.index_select(0, index)
        gathered = tuple(picked[id(tensor)] for tensor in table_inputs)
        views = _split_views(gathered, [*side_sizes[0], *side_sizes[1]])  # type: ignore[arg-type]
        n_chunks = len(side_sizes[0])
        return [views[:n_chunks], views[n_chunks:]]

    def _table_inputs(
        self,
        table: pair_table.PreferenceTable,
    ) -> Optional[Tuple[Inputs, Tuple[np.ndarray, np.ndarray]]]:
        """The whole dataset's converted inputs, if small; cached.

        The first fragments' transitions come first, then the second
        fragments'; also returned: each side's fragment offsets in those rows.
        """
        cached = self._staged_table
        if cached is not None and cached[0] is table and cached[1] == self.task.device:
            return cached[2]
        if table.lengths.sum() * self._input_bytes(table) > STAGED_TABLE_BYTES:
            return None
        every = np.arange(len(table))
        first, second = (table.side_layout(every, side) for side in (0, 1))
        sides = [
            self.task.convert(layout, 0, layout.n_transitions)
            for layout in (first, second)
        ]
        joined: Dict[Tuple[int, int], th.Tensor] = {}  # next_state may be state
        for a, b in zip(*sides):
            if (id(a), id(b)) not in joined:
                joined[id(a), id(b)] = th.cat([a, b])
        inputs = tuple(joined[id(a), id(b)] for a, b in zip(*sides))
        offsets = (first.offsets, second.offsets + first.n_transitions)
        self._staged_table = (table, self.task.device, (inputs, offsets))
        return inputs, offsets  # type: ignore[return-value]

    def chunks(
        self,
        table: pair_table.PreferenceTable,
        local: np.ndarray,
        item_chunks: Sequence[slice],
    ) -> List[PairChunk]:
        """Chunks of pairs ``local`` whose calls read inputs converted once.

        The batch's inputs and preferences are gathered once and split into the
        chunks' views in one operation per tensor (the per-step bookkeeping of a
        small net costs more than its calls).
        """
        placement = self._placement(table, local, item_chunks)
        inputs = self._chunk_inputs(
            table, local, placement.layouts, placement.side_sizes
        )
        preferences = th.as_tensor(
            table.preferences[local], dtype=th.float32, device=self.task.device
        )
        prefers_first = (preferences > 0.5).split_with_sizes(placement.pair_counts)
        per_chunk = preferences.split_with_sizes(placement.pair_counts)
        return [
            PairChunk(
                layouts,
                per_chunk[k],
                prefers_first[k],
                discounts,
                (StagedSide(inputs[0][k]), StagedSide(inputs[1][k])),
            )
            for k, (layouts, discounts) in enumerate(
                zip(placement.chunk_layouts, placement.chunk_discounts)
            )
        ]

    def _placement(
        self,
        table: pair_table.PreferenceTable,
        local: np.ndarray,
        item_chunks: Sequence[slice],
    ) -> _Placement:
        """Where the transitions of pairs ``local`` go, chunk by chunk; cached.

        It depends only on the pairs' lengths and terminal flags and on the
        chunks' bounds, which repeat from step to step.
        """
        bounds = tuple((items.start, items.stop) for items in item_chunks)
        key = (
            table.lengths[local].tobytes(),
            table.terminal[local].tobytes(),
            bounds,
            self.task.device,
        )
        placement = self._placements.get(key)
        if placement is not None:
            return placement
        batch = self.task.make_chunk(table, local, with_fragments=False)
        side_sizes = [
            [
                int(layout.offsets[stop] - layout.offsets[start])
                for start, stop in bounds
            ]
            for layout in batch.layouts
        ]
        discounts = [
            [None] * len(bounds) if weights is None else weights.split_with_sizes(sizes)
            for weights, sizes in zip(batch.discounts, side_sizes)
        ]
        placement = _Placement(
            layouts=batch.layouts,
            side_sizes=side_sizes,
            pair_counts=[stop - start for start, stop in bounds],
            chunk_layouts=[
                (
                    sub_layout(batch.layouts[0], items),
                    sub_layout(batch.layouts[1], items),
                )
                for items in item_chunks
            ],
            chunk_discounts=[
                (discounts[0][k], discounts[1][k]) for k in range(len(bounds))
            ],
        )
        if len(self._placements) >= PLACEMENTS_CACHED:
            self._placements.clear()
        self._placements[key] = placement
        return placement


def _split_views(inputs: Inputs, sizes: List[int]) -> List[Inputs]:
    """``inputs`` cut into consecutive row ranges of ``sizes``, as views."""
    splits: Dict[int, Sequence[th.Tensor]] = {}  # next_state may be state itself
    for tensor in inputs:
        if id(tensor) not in splits:
            splits[id(tensor)] = tensor.split_with_sizes(sizes)
    return [
        tuple(splits[id(tensor)][k] for tensor in inputs)  # type: ignore[misc]
        for k in range(len(sizes))
    ]
