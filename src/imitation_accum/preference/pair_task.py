"""The preference-comparison half of a step: pairs in, per-pair losses out.

A chunk holds consecutive fragment pairs of a batch. The first fragments of its
pairs are laid end to end, and so are the second fragments (the two *sides*);
the net is called on the sides in turn, ``forward_size`` transitions at a time:
call ``k`` of the first side, then call ``k`` of the second (see
:mod:`imitation_accum.planning.plan` for why: exact zeros). The per-transition
rewards are summed (discounted from each fragment's first transition) into
returns, and each pair's loss is imitation's: the binary cross-entropy between
the preference and the Boltzmann-rational probability that the first fragment is
preferred, with ``noise_prob`` and ``threshold`` as in imitation's
``PreferenceModel``.

When one pair does not fit in memory, each side of the batch is laid end to end
once and cut into :class:`TransitionChunk` ranges that may split fragments (a
two-pass plan), the sides' ranges in turn; the engine then runs its two-pass
method: a chunk contributes each of its fragments' discounted partial return,
with discount weights counted from the fragment's own first transition.
"""

from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons
from imitation.rewards import reward_nets
from imitation.util import util
from torch.nn import functional as F  # noqa: N812

from imitation_accum.engine import staging
from imitation_accum.engine.accumulator import ChunkLoss
from imitation_accum.nets import input_preparation
from imitation_accum.preference import fragments, pair_table, staged_batch
from imitation_accum.preference.pair_chunks import (
    PairChunk,
    TransitionChunk,
)
from imitation_accum.preference.pair_loss import (
    preference_losses,
    probability_first_preferred,
)

Inputs = Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]


class PreferenceTask:
    """Forward and loss of pair chunks for one reward net.

    Its metric (summed over pairs) is ``accuracy``.

    Args:
        net: The reward net (``preprocess`` then ``forward`` per call).
        noise_prob: As in imitation's ``PreferenceModel``.
        discount_factor: As in imitation's ``PreferenceModel``.
        threshold: As in imitation's ``PreferenceModel``.
        stager: Moves chunk inputs to the device a chunk ahead (``None``: each
            call gathers its own).
    """

    metric_names = ("accuracy",)

    def __init__(
        self,
        net: reward_nets.RewardNet,
        *,
        noise_prob: float,
        discount_factor: float,
        threshold: float,
        stager: Optional[staging.RangeStager] = None,
    ) -> None:
        self.net = net
        self.noise_prob = noise_prob
        self.discount_factor = discount_factor
        self.threshold = threshold
        # What each call runs after net.preprocess: the net, or a wrapper that
        # forwards to it and must see every forward (DistributedDataParallel).
        self.call_target: th.nn.Module = net
        self.device = net.device
        self.inputs = input_preparation.InputPreparer(net)
        self.stager = stager
        self.staged = staged_batch.StagedBatches(self)
        """Batches of small inputs, converted once (see its module)."""

    def refresh_device(self) -> None:
        """Re-reads the net's device (looked up once per step, not per call)."""
        self.device = self.net.device

    def _to_device(self, array: staging.HostArray) -> th.Tensor:
        return util.safe_to_tensor(array).to(self.device)

    def make_chunk(
        self,
        table: pair_table.PreferenceTable,
        indices: np.ndarray,
        *,
        with_fragments: bool = True,
    ) -> PairChunk:
        """Lays out pairs ``indices`` of ``table``; preferences go to the device.

        Without fragments, the layouts only place transitions (calls then read
        inputs converted beforehand).
        """
        layouts = tuple(
            table.side_layout(indices, side, with_fragments=with_fragments)
            for side in (0, 1)
        )
        discounts = tuple(self._discounts(layout) for layout in layouts)
        prefs = th.as_tensor(
            table.preferences[indices], dtype=th.float32, device=self.device
        )
        return PairChunk(layouts, prefs, prefs > 0.5, discounts)  # type: ignore[arg-type]

    def convert(
        self,
        layout: staging.RowSource,
        start: int,
        stop: int,
    ) -> Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """The net's converted inputs of transitions ``[start, stop)`` of ``layout``.

        Frames travel to the device as stored (uint8) and are converted there.
        """
        obs, acts, next_obs, dones = layout.gather(
            start,
            stop,
            next_obs=self.inputs.reads_next_state,
        )
        return self.inputs(
            self._to_device(obs),
            self._to_device(acts),
            None if next_obs is None else self._to_device(next_obs),
            self._to_device(dones),
        )

    def _discounts(self, layout: fragments.FragmentLayout) -> Optional[th.Tensor]:
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

        Args:
            layout: The fragments, laid end to end.
            start: First transition.
            stop: One past the last transition.
            module: What the call runs after ``preprocess``; by default
                ``call_target``.

        Returns:
            One reward per transition.
        """
        return self.run(self.convert(layout, start, stop), start, stop, module)

    def run(
        self,
        inputs: Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor],
        start: int,
        stop: int,
        module: Optional[th.nn.Module] = None,
    ) -> th.Tensor:
        """One reward-net call on converted ``inputs`` of transitions ``[start, stop)``.

        Args:
            inputs: ``(state, action, next_state, done)``, one row per transition.
            start: First transition.
            stop: One past the last transition.
            module: What the call runs; by default ``call_target``.

        Returns:
            One reward per transition.

        Raises:
            ValueError: if the net does not return one reward per transition.
        """
        through = self.call_target if module is None else module
        rewards = through(*inputs)
        if rewards.shape != (stop - start,):
            raise ValueError(
                f"reward net returned shape {tuple(rewards.shape)} for "
                f"{stop - start} transitions; expected ({stop - start},)",
            )
        return rewards

    def forward(
        self,
        chunk: Union[PairChunk, TransitionChunk],
        forward_size: int,
    ) -> Union[th.Tensor, "SideRewards"]:
        """Per-transition rewards of ``chunk``, each side apart (:class:`SideRewards`).

        The sides are called in turn, ``forward_size`` transitions at a time (a
        two-pass chunk is one call on one side, and gives one tensor).
        """
        if isinstance(chunk, TransitionChunk):
            layout = chunk.batch.layouts[chunk.side]
            staged = self.stager.fetch(chunk)[0] if self.stager else layout
            return self.call(staged, chunk.start, chunk.stop)
        outputs: Tuple[List[th.Tensor], List[th.Tensor]] = ([], [])
        sources: Sequence[staging.RowSource] = (
            self.stager.fetch(chunk) if self.stager else chunk.layouts
        )
        sizes = [source.n_transitions for source in sources]
        for start in range(0, max(sizes), forward_size):
            for side, source in enumerate(sources):
                if start < sizes[side]:
                    stop = min(start + forward_size, sizes[side])
                    outputs[side].append(
                        self._side_call(chunk, side, source, start, stop, sizes[side])
                    )
        return SideRewards(*(_joined(side) for side in outputs))

    def _side_call(
        self,
        chunk: PairChunk,
        side: int,
        source: "staging.RowSource",
        start: int,
        stop: int,
        side_transitions: int,
    ):
        if chunk.staged is None:
            return self.call(source, start, stop)
        inputs = chunk.staged[side].inputs
        if start or stop < side_transitions:  # a call over part of the side
            inputs = tuple(tensor[start:stop] for tensor in inputs)  # type: ignore
        return self.run(inputs, start, stop)

    def returns(
        self, chunk: PairChunk, rewards: "SideRewards"
    ) -> Tuple[th.Tensor, th.Tensor]:
        """Each fragment's discounted return: the first fragments', the second's."""
        sides = (rewards.first, rewards.second)
        returns = []
        for layout, discounts, side_rewards in zip(
            chunk.layouts, chunk.discounts, sides
        ):
            if discounts is not None:
                side_rewards = side_rewards * discounts
            returns.append(layout.segment_sums(side_rewards))
        return returns[0], returns[1]

    def loss(self, chunk: PairChunk, outputs: "SideRewards") -> ChunkLoss:
        """Per-pair cross-entropy losses and correct-prediction counts."""
        return self._loss_of_returns(chunk, *self.returns(chunk, outputs))

    def partial_sums(self, chunk: TransitionChunk, outputs: th.Tensor) -> th.Tensor:
        """Two-pass: the chunk's part of every return, ``[R_a..., R_b...]``."""
        discounts = chunk.batch.discounts[chunk.side]
        if discounts is not None:
            # Weights counted from each fragment's first transition, also for a
            # chunk that starts inside a fragment.
            outputs = outputs * discounts[chunk.start : chunk.stop]
        layout = chunk.batch.layouts[chunk.side]
        part = layout.range_sums(outputs, chunk.start, chunk.stop)
        zeros = part.new_zeros(chunk.batch.n_pairs)
        return th.cat([part, zeros] if chunk.side == 0 else [zeros, part])

    def loss_of_sums(
        self,
        chunks: Sequence[TransitionChunk],
        sums: th.Tensor,
    ) -> ChunkLoss:
        """Two-pass: every pair's loss from the returns of the whole batch."""
        batch = chunks[0].batch
        return self._loss_of_returns(
            batch, sums[: batch.n_pairs], sums[batch.n_pairs :]
        )

    def _loss_of_returns(
        self,
        chunk: PairChunk,
        returns_a: th.Tensor,
        returns_b: th.Tensor,
    ) -> ChunkLoss:
        losses, probs = preference_losses(
            returns_a,
            returns_b,
            chunk.preferences,
            self.noise_prob,
            self.threshold,
        )
        correct = ((probs > 0.5) == chunk.prefers_first).sum()
        return ChunkLoss(
            loss_sum=losses.sum(),
            item_losses=losses.detach(),
            metric_sums={"accuracy": correct.detach()},
        )

    def ground_truth_losses(
        self,
        table: pair_table.PreferenceTable,
    ) -> Optional[np.ndarray]:
        """Per-pair cross-entropy of the true rewards' preferences (``gt_reward_loss``).

        Computed once per ``train()`` call, so that a step's figure is a mean over
        its pairs rather than a pass over its fragments.

        Args:
            table: The dataset.

        Returns:
            One loss per pair, as ``F.binary_cross_entropy`` computes it, or
            ``None`` if some fragment has no rewards.
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
            returns[0::2],
            returns[1::2],
            self.noise_prob,
            self.threshold,
        )
        losses = F.binary_cross_entropy(
            probs,
            th.as_tensor(table.preferences, dtype=th.float32),
            reduction="none",
        )
        return losses.numpy()


class SideRewards(NamedTuple):
    """A pair chunk's per-transition rewards, each side's on its own.

    Kept apart rather than concatenated: the returns sum each side, so a
    concatenation would only be sliced again, two more nodes for the backward.
    """

    first: th.Tensor
    second: th.Tensor

    def float(self) -> "SideRewards":
        """Both sides as float32 (the engine's cast of autocast outputs)."""
        if self.first.dtype == self.second.dtype == th.float32:
            return self
        return SideRewards(self.first.float(), self.second.float())


def _joined(calls: List[th.Tensor]) -> th.Tensor:
    return calls[0] if len(calls) == 1 else th.cat(calls)


def task_for(
    preference_model: preference_comparisons.PreferenceModel,
    stager: Optional[staging.RangeStager] = None,
) -> PreferenceTask:
    """A task that computes what ``preference_model`` defines."""
    return PreferenceTask(
        preference_model.model,
        noise_prob=preference_model.noise_prob,
        discount_factor=preference_model.discount_factor,
        threshold=preference_model.threshold,
        stager=stager,
    )
