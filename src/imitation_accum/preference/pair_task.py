"""The preference-comparison half of a step: pairs in, per-pair losses out.

A :class:`PairChunk` holds consecutive pairs of a batch, each side (first or
second fragments) laid end to end and called ``forward_size`` transitions at a
time, the sides in turn (see :mod:`imitation_accum.planning.plan`: exact zeros).
Rewards are summed, discounted from each fragment's first transition, into returns;
each pair's loss is imitation's cross-entropy of its ``PreferenceModel``. A
two-pass plan cuts each side of the batch into :class:`TransitionChunk` ranges
that may split fragments. Small inputs (an MLP's) are converted once per batch or
per ``train()`` call (:class:`ConvertedBatches`).
"""

import dataclasses
from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons
from imitation.rewards import reward_nets
from imitation.util import util
from torch.nn import functional as F  # noqa: N812

from imitation_accum.engine import staging
from imitation_accum.engine.accumulator import ChunkLoss
from imitation_accum.nets import input_preparation
from imitation_accum.nets.input_preparation import NetInputs
from imitation_accum.planning.plan import StepPlan
from imitation_accum.preference import pair_table

#: A one-pass batch whose converted inputs take at most this many bytes is
#: converted once per step (per-call conversion would cost more than the call).
CONVERTED_BATCH_BYTES = 4 * 2**20
#: A dataset whose converted inputs take at most this many bytes is converted
#: once per ``train()`` call; each step then indexes the rows of its batch.
CONVERTED_TABLE_BYTES = 16 * 2**20
#: Chunk placements kept: batches of equal-length fragments share one.
PLACEMENTS_CACHED = 64

Layouts = Tuple[pair_table.FragmentLayout, pair_table.FragmentLayout]
Discounts = Tuple[Optional[th.Tensor], Optional[th.Tensor]]


def probability_first_preferred(
    returns_a: th.Tensor,
    returns_b: th.Tensor,
    noise_prob: float,
    threshold: float,
) -> th.Tensor:
    """Imitation's ``PreferenceModel.probability``, vectorized over pairs."""
    returns_diff = th.clamp(returns_b - returns_a, -threshold, threshold)
    # sigmoid(-d) is imitation's 1 / (1 + exp(d)) in one kernel.
    model_probability = th.sigmoid(-returns_diff)
    if noise_prob == 0:
        return model_probability
    return noise_prob * 0.5 + (1 - noise_prob) * model_probability


def preference_losses(
    returns_a: th.Tensor,
    returns_b: th.Tensor,
    preferences: th.Tensor,
    noise_prob: float,
    threshold: float,
) -> Tuple[th.Tensor, th.Tensor]:
    """Per-pair cross-entropy of imitation's preference model.

    Without noise it is computed from the logit (stable where the probability
    rounds to 0 or 1). A non-finite return gives a non-finite loss, not an
    exception as in ``F.binary_cross_entropy``, so the engine can discard the step.

    Returns:
        The per-pair losses and the (detached) predicted probabilities.
    """
    if noise_prob == 0:
        # The logit of the first fragment being preferred: -clip(R_b - R_a).
        logits = th.clamp(returns_a - returns_b, -threshold, threshold)
        losses = F.binary_cross_entropy_with_logits(
            logits, preferences, reduction="none"
        )
        return losses, th.sigmoid(logits.detach())
    probs = probability_first_preferred(returns_a, returns_b, noise_prob, threshold)
    losses = -(preferences * th.log(probs) + (1 - preferences) * th.log1p(-probs))
    return losses, probs.detach()


@dataclasses.dataclass
class PairChunk:
    """Consecutive fragment pairs of a batch, ready for the reward net.

    Attributes:
        layouts: Fragments ``[a0, a1, ...]`` and ``[b0, b1, ...]``, each end to end.
        preferences: Probability that ``a_i`` is preferred, on the net's device.
        prefers_first: Whether ``a_i`` is the preferred one (preference > 0.5).
        discounts: Each side's per-transition discount weights (``None``: 1).
        forward_size: Transitions per reward-net call, the sides' calls in turn.
        converted_inputs: Each side's net inputs, views of the batch's converted
            once (``None``: each call converts its own).
    """

    layouts: Layouts
    preferences: th.Tensor
    prefers_first: th.Tensor
    discounts: Discounts
    forward_size: int
    converted_inputs: Optional[Tuple[NetInputs, NetInputs]] = None

    @property
    def n_pairs(self) -> int:
        """Pairs in the chunk."""
        return len(self.preferences)


@dataclasses.dataclass
class TransitionChunk:
    """Transitions ``[start, stop)`` of side ``side`` of a whole batch (two-pass)."""

    batch: PairChunk
    side: int
    start: int
    stop: int

    @property
    def n_transitions(self) -> int:
        """Transitions in the chunk."""
        return self.stop - self.start


class SideRewards(NamedTuple):
    """A pair chunk's per-transition rewards, each side's apart (summed apart)."""

    first: th.Tensor
    second: th.Tensor

    def float(self) -> "SideRewards":
        """Both sides as float32 (the engine's cast of autocast outputs)."""
        if self.first.dtype == self.second.dtype == th.float32:
            return self
        return SideRewards(self.first.float(), self.second.float())


class PreferenceTask:
    """Forward and loss of pair chunks for one reward net; its metric: ``accuracy``.

    Args:
        net: The reward net (``preprocess`` then ``forward`` per call).
        noise_prob: As in imitation's ``PreferenceModel``.
        discount_factor: As in imitation's ``PreferenceModel``.
        threshold: As in imitation's ``PreferenceModel``.
        stager: Moves chunk inputs to the device a chunk ahead (``None``: each
            call gathers its own).
        call_target: What each call runs after ``net.preprocess``: the net, or a
            wrapper that must see every forward (``DistributedDataParallel``).
    """

    metric_names = ("accuracy",)

    def __init__(
        self,
        net: reward_nets.RewardNet,
        *,
        noise_prob: float,
        discount_factor: float,
        threshold: float,
        stager: Optional[staging.Stager] = None,
        call_target: Optional[th.nn.Module] = None,
    ) -> None:
        self.net = net
        self.noise_prob = noise_prob
        self.discount_factor = discount_factor
        self.threshold = threshold
        self.call_target: th.nn.Module = net if call_target is None else call_target
        self.device = net.device
        self.inputs = input_preparation.InputPreparer(net)
        self.stager = stager
        self.converted_batches = ConvertedBatches(self)

    def refresh_device(self) -> None:
        """Re-reads the net's device (looked up once per step, not per call)."""
        self.device = self.net.device

    def _to_device(self, array: staging.HostArray) -> th.Tensor:
        return util.safe_to_tensor(array).to(self.device)

    def make_chunk(
        self,
        table: pair_table.PreferenceTable,
        indices: np.ndarray,
        forward_size: int,
    ) -> PairChunk:
        """Lays out pairs ``indices`` of ``table``; preferences go to the device."""
        layouts = tuple(table.side_layout(indices, side) for side in (0, 1))
        discounts = tuple(self.discount_weights(layout) for layout in layouts)
        prefs = th.as_tensor(
            table.preferences[indices], dtype=th.float32, device=self.device
        )
        return PairChunk(layouts, prefs, prefs > 0.5, discounts, forward_size)  # type: ignore[arg-type]

    def convert(self, layout: staging.RowSource, start: int, stop: int) -> NetInputs:
        """The net's inputs of transitions ``[start, stop)``, converted on device."""
        obs, acts, next_obs, dones = layout.gather(
            start, stop, next_obs=self.inputs.reads_next_state
        )
        return self.inputs(
            self._to_device(obs),
            self._to_device(acts),
            None if next_obs is None else self._to_device(next_obs),
            self._to_device(dones),
        )

    def discount_weights(
        self, layout: pair_table.FragmentLayout
    ) -> Optional[th.Tensor]:
        """Per transition of ``layout``, its discount weight (``None`` for 1)."""
        if self.discount_factor == 1:
            return None
        weights = layout.discount_weights(self.discount_factor)
        return th.as_tensor(weights, device=self.device)

    def call(
        self,
        layout: staging.RowSource,
        start: int,
        stop: int,
        module: Optional[th.nn.Module] = None,
    ) -> th.Tensor:
        """One reward-net call on transitions ``[start, stop)`` of ``layout``.

        ``module`` is what runs after ``preprocess`` (default ``call_target``).
        """
        return self.run(self.convert(layout, start, stop), start, stop, module)

    def run(
        self,
        inputs: NetInputs,
        start: int,
        stop: int,
        module: Optional[th.nn.Module] = None,
    ) -> th.Tensor:
        """One reward-net call on converted ``inputs`` of transitions ``[start, stop)``.

        Raises:
            ValueError: if the net does not return one reward per transition.
        """
        rewards = (self.call_target if module is None else module)(*inputs)
        if rewards.shape != (stop - start,):
            raise ValueError(
                f"reward net returned shape {tuple(rewards.shape)} for "
                f"{stop - start} transitions; expected ({stop - start},)",
            )
        return rewards

    def forward(
        self, chunk: Union[PairChunk, TransitionChunk]
    ) -> Union[th.Tensor, SideRewards]:
        """Per-transition rewards of ``chunk``: :class:`SideRewards`, or one tensor.

        The sides are called in turn, the chunk's ``forward_size`` transitions at a
        time; a two-pass chunk is one call on one side.
        """
        sources: Sequence[staging.RowSource]
        if self.stager is not None:
            sources = staging.staged_rows(_ranges(chunk), self.stager.fetch(chunk))
        elif isinstance(chunk, TransitionChunk):
            sources = [chunk.batch.layouts[chunk.side]]
        else:
            sources = chunk.layouts
        if isinstance(chunk, TransitionChunk):
            return self.call(sources[0], chunk.start, chunk.stop)
        outputs: Tuple[List[th.Tensor], List[th.Tensor]] = ([], [])
        sizes = [source.n_transitions for source in sources]
        forward_size = chunk.forward_size
        for start in range(0, max(sizes), forward_size):
            for side, source in enumerate(sources):
                if start >= sizes[side]:
                    continue
                stop = min(start + forward_size, sizes[side])
                if chunk.converted_inputs is None:
                    outputs[side].append(self.call(source, start, stop))
                    continue
                inputs = chunk.converted_inputs[side]
                if start or stop < sizes[side]:  # a call over part of the side
                    inputs = tuple(t[start:stop] for t in inputs)  # type: ignore
                outputs[side].append(self.run(inputs, start, stop))
        return SideRewards(*(o[0] if len(o) == 1 else th.cat(o) for o in outputs))

    def loss(self, chunk: PairChunk, outputs: SideRewards) -> ChunkLoss:
        """Per-pair cross-entropy losses and correct-prediction counts."""
        returns = []
        for layout, discounts, rewards in zip(chunk.layouts, chunk.discounts, outputs):
            if discounts is not None:
                rewards = rewards * discounts
            returns.append(layout.segment_sums(rewards))
        return self._loss_of_returns(chunk, *returns)

    def partial_sums(self, chunk: TransitionChunk, outputs: th.Tensor) -> th.Tensor:
        """Two-pass: the chunk's part of every return, ``[R_a..., R_b...]``."""
        discounts = chunk.batch.discounts[chunk.side]
        if discounts is not None:
            # Counted from each fragment's first transition, also for a chunk
            # that starts inside a fragment.
            outputs = outputs * discounts[chunk.start : chunk.stop]
        layout = chunk.batch.layouts[chunk.side]
        part = layout.range_sums(outputs, chunk.start, chunk.stop)
        zeros = part.new_zeros(chunk.batch.n_pairs)
        return th.cat([part, zeros] if chunk.side == 0 else [zeros, part])

    def loss_of_sums(
        self, chunks: Sequence[TransitionChunk], sums: th.Tensor
    ) -> ChunkLoss:
        """Two-pass: every pair's loss from the returns of the whole batch."""
        batch = chunks[0].batch
        n = batch.n_pairs
        return self._loss_of_returns(batch, sums[:n], sums[n:])

    def _loss_of_returns(
        self, chunk: PairChunk, returns_a: th.Tensor, returns_b: th.Tensor
    ) -> ChunkLoss:
        losses, probs = preference_losses(
            returns_a, returns_b, chunk.preferences, self.noise_prob, self.threshold
        )
        correct = ((probs > 0.5) == chunk.prefers_first).sum()
        return ChunkLoss(
            loss_sum=losses.sum(),
            item_losses=losses.detach(),
            metric_sums={"accuracy": correct.detach()},
        )

    def ground_truth_losses(
        self, table: pair_table.PreferenceTable
    ) -> Optional[np.ndarray]:
        """Per-pair cross-entropy of the true rewards' preferences (per ``train()``).

        Returns:
            One loss per pair (``gt_reward_loss``, as ``F.binary_cross_entropy``
            computes it), or ``None`` if some fragment has no rewards.
        """
        all_rews = table.rewards()
        if all_rews is None:
            return None
        layout = table.layout(np.arange(len(table)))
        rews = th.as_tensor(all_rews, dtype=th.float32)
        if self.discount_factor != 1:
            rews = rews * th.as_tensor(layout.discount_weights(self.discount_factor))
        returns = layout.segment_sums(rews)
        probs = probability_first_preferred(
            returns[0::2], returns[1::2], self.noise_prob, self.threshold
        )
        losses = F.binary_cross_entropy(
            probs,
            th.as_tensor(table.preferences, dtype=th.float32),
            reduction="none",
        )
        return losses.numpy()


def task_for(
    preference_model: preference_comparisons.PreferenceModel,
    stager: Optional[staging.Stager] = None,
    call_target: Optional[th.nn.Module] = None,
) -> PreferenceTask:
    """A task that computes what ``preference_model`` defines."""
    return PreferenceTask(
        preference_model.model,
        noise_prob=preference_model.noise_prob,
        discount_factor=preference_model.discount_factor,
        threshold=preference_model.threshold,
        stager=stager,
        call_target=call_target,
    )


def make_chunks(
    task: PreferenceTask,
    table: pair_table.PreferenceTable,
    local: np.ndarray,
    plan: StepPlan,
) -> List[Union[PairChunk, TransitionChunk]]:
    """The chunks of pairs ``local`` (this process's share of a batch) ``plan`` says.

    Returns:
        Chunks of whole pairs (one pass) or of transition ranges (two passes).
    """
    if not len(local):
        return []
    chunks: List[Union[PairChunk, TransitionChunk]]
    if plan.two_pass:
        batch = task.make_chunk(table, local, plan.forward_size)
        chunks = [
            TransitionChunk(batch, side, start, stop)
            for side, start, stop in plan.transition_chunks
        ]
    elif task.stager is None and task.converted_batches.applies(table, local):
        # Converted once for the batch, already on the device: nothing to stage.
        converted = task.converted_batches
        return list(converted.chunks(table, local, plan.item_chunks, plan.forward_size))
    else:
        size = plan.forward_size
        chunks = [task.make_chunk(table, local[s], size) for s in plan.item_chunks]
    if task.stager is not None:  # inputs move a chunk ahead (engine.staging)
        next_obs = task.inputs.reads_next_state
        task.stager.schedule(
            chunks,
            lambda chunk: staging.range_arrays(_ranges(chunk), next_obs=next_obs),
            task.device,
        )
    return chunks


def _ranges(chunk: Union[PairChunk, TransitionChunk]) -> staging.Ranges:
    if isinstance(chunk, TransitionChunk):
        return [(chunk.batch.layouts[chunk.side], chunk.start, chunk.stop)]
    return [(layout, 0, layout.n_transitions) for layout in chunk.layouts]


class _Placement(NamedTuple):
    """Where a batch's transitions go, chunk by chunk (see ``_placement``)."""

    side_sizes: List[List[int]]  # per side, the transitions of each chunk
    pair_counts: List[int]
    chunk_layouts: List[Layouts]
    chunk_discounts: List[Discounts]


class ConvertedBatches:
    """The converted inputs of a task's batches, and their chunks.

    Where each chunk's transitions go depends only on the pairs' lengths and
    terminal flags and the chunks' bounds, so it is cached.

    Args:
        task: Converts inputs and lays pairs out for the reward net.
    """

    def __init__(self, task: PreferenceTask) -> None:
        self.task = task
        self._converted_table: Optional[tuple] = None
        self._placements: Dict[Hashable, _Placement] = {}

    def applies(self, table: pair_table.PreferenceTable, local: np.ndarray) -> bool:
        """Whether the inputs of pairs ``local`` are converted once for the batch.

        Only for the net's stock ``preprocess`` (row by row, so that slicing its
        output equals converting the slice) and inputs of at most
        :data:`CONVERTED_BATCH_BYTES`.
        """
        if not self.task.inputs.uses_stock_preprocess or not len(local):
            return False
        n_transitions = int(table.lengths[local].sum())
        return n_transitions * self._input_bytes(table) <= CONVERTED_BATCH_BYTES

    def _input_bytes(self, table: pair_table.PreferenceTable) -> int:
        """Bytes of one transition's converted inputs (float32 observations)."""
        frame = table.first_obs()
        width = int(np.prod(frame.shape[1:])) * 4
        return width * (2 if self.task.inputs.reads_next_state else 1)

    def _chunk_inputs(
        self,
        table: pair_table.PreferenceTable,
        local: np.ndarray,
        side_sizes: Sequence[List[int]],
    ) -> List[List[NetInputs]]:
        """Per side, per chunk, views of the converted inputs of pairs ``local``."""
        converted = self._table_inputs(table)
        if converted is None:
            layouts = [table.side_layout(local, side) for side in (0, 1)]
            return [
                _split_views(self.task.convert(layout, 0, layout.n_transitions), sizes)
                for layout, sizes in zip(layouts, side_sizes)
            ]
        # Both sides in one gather and one split per tensor.
        table_inputs, offsets = converted
        rows = np.concatenate(
            [
                _transition_rows(offsets[side], local, table.lengths[local, side])
                for side in (0, 1)
            ]
        )
        index = th.as_tensor(rows, device=self.task.device)
        gathered = _each_once(table_inputs, lambda t: t.index_select(0, index))
        views = _split_views(gathered, [*side_sizes[0], *side_sizes[1]])
        n_chunks = len(side_sizes[0])
        return [views[:n_chunks], views[n_chunks:]]

    def _table_inputs(
        self,
        table: pair_table.PreferenceTable,
    ) -> Optional[Tuple[NetInputs, Tuple[np.ndarray, np.ndarray]]]:
        """The whole dataset's converted inputs, if small, and each side's offsets.

        Cached; the first fragments' transitions come first, then the second's.
        """
        cached = self._converted_table
        if cached is not None and cached[0] is table and cached[1] == self.task.device:
            return cached[2]
        if table.lengths.sum() * self._input_bytes(table) > CONVERTED_TABLE_BYTES:
            return None
        every = np.arange(len(table))
        first, second = (table.side_layout(every, side) for side in (0, 1))
        sides = [
            self.task.convert(layout, 0, layout.n_transitions)
            for layout in (first, second)
        ]
        second_of = {id(a): b for a, b in zip(*sides)}
        inputs = _each_once(sides[0], lambda a: th.cat([a, second_of[id(a)]]))
        offsets = (first.offsets, second.offsets + first.n_transitions)
        self._converted_table = (table, self.task.device, (inputs, offsets))
        return inputs, offsets

    def chunks(
        self,
        table: pair_table.PreferenceTable,
        local: np.ndarray,
        item_chunks: Sequence[slice],
        forward_size: int,
    ) -> List[PairChunk]:
        """Chunks of pairs ``local`` whose calls read inputs converted once.

        Inputs and preferences are gathered once and split into the chunks' views,
        one operation per tensor.
        """
        placement = self._placement(table, local, item_chunks)
        inputs = self._chunk_inputs(table, local, placement.side_sizes)
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
                forward_size,
                (inputs[0][k], inputs[1][k]),
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
        """Where the transitions of pairs ``local`` go, chunk by chunk; cached."""
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
        layouts = [_placed(table, local, side) for side in (0, 1)]
        starts, stops = np.array(bounds).T
        side_sizes = [
            (lay.offsets[stops] - lay.offsets[starts]).tolist() for lay in layouts
        ]
        discounts = [
            [None] * len(bounds) if weights is None else weights.split_with_sizes(sizes)
            for weights, sizes in zip(
                (self.task.discount_weights(layout) for layout in layouts), side_sizes
            )
        ]
        placement = _Placement(
            side_sizes=side_sizes,
            pair_counts=[stop - start for start, stop in bounds],
            chunk_layouts=[
                (_placed(table, local[items], 0), _placed(table, local[items], 1))
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


def _placed(
    table: pair_table.PreferenceTable,
    pairs: np.ndarray,
    side: int,
) -> pair_table.FragmentLayout:
    """The ``side`` fragments of ``pairs`` laid out without them (cacheable)."""
    return pair_table.FragmentLayout.from_arrays(
        (), table.lengths[pairs, side], table.terminal[pairs, side]
    )


def _each_once(inputs: Sequence[th.Tensor], fn: Callable[[th.Tensor], Any]) -> Any:
    """``fn`` of each of ``inputs``, once per distinct tensor (``state`` may repeat)."""
    done: Dict[int, Any] = {}
    for tensor in inputs:
        if id(tensor) not in done:
            done[id(tensor)] = fn(tensor)
    return tuple(done[id(tensor)] for tensor in inputs)


def _split_views(inputs: NetInputs, sizes: List[int]) -> List[NetInputs]:
    """``inputs`` cut into consecutive row ranges of ``sizes``, as views."""
    splits = _each_once(inputs, lambda tensor: tensor.split_with_sizes(sizes))
    return [tuple(split[k] for split in splits) for k in range(len(sizes))]


def _transition_rows(
    offsets: np.ndarray,
    items: np.ndarray,
    lengths: np.ndarray,
) -> np.ndarray:
    """Rows of fragments ``items`` (of ``lengths``) in a layout with ``offsets``."""
    starts = offsets[items]
    before = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) + np.repeat(starts - before, lengths)
