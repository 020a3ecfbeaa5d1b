"""The preference-comparison half of a step: pairs in, per-pair losses out.

A chunk holds consecutive fragment pairs of a batch. Its fragments are laid end
to end and run through the reward net in calls of ``forward_size`` transitions;
the per-transition rewards are summed (discounted from each fragment's first
transition) into returns, and each pair's loss is imitation's: the binary
cross-entropy between the preference and the Boltzmann-rational probability that
the first fragment is preferred, with ``noise_prob`` and ``threshold`` as in
imitation's ``PreferenceModel``.
"""

import dataclasses
from typing import Optional, Sequence, Tuple

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons
from imitation.data import types
from imitation.rewards import reward_nets
from imitation.util import util
from torch.nn import functional as F  # noqa: N812

from imitation_accum import accumulation, fragments

Pair = Tuple[types.Trajectory, types.Trajectory]


@dataclasses.dataclass
class PairChunk:
    """Consecutive fragment pairs of a batch, ready for the reward net."""

    layout: fragments.FragmentLayout
    """Fragments ``[a0, b0, a1, b1, ...]`` laid end to end."""
    preferences: th.Tensor
    """Probability that fragment ``a_i`` is preferred, on the net's device."""
    discounts: Optional[th.Tensor]
    """Per-transition discount weights, or ``None`` when the discount is 1."""

    @property
    def n_pairs(self) -> int:
        """Pairs in the chunk."""
        return len(self.preferences)


def probability_first_preferred(
    returns_a: th.Tensor,
    returns_b: th.Tensor,
    noise_prob: float,
    threshold: float,
) -> th.Tensor:
    """Imitation's ``PreferenceModel.probability``, vectorized over pairs.

    Args:
        returns_a: Returns of the first fragments.
        returns_b: Returns of the second fragments.
        noise_prob: Probability that a preference is uniformly random.
        threshold: Return differences are clipped to ``[-threshold, threshold]``.

    Returns:
        Probability that each first fragment is preferred.
    """
    returns_diff = th.clip(returns_b - returns_a, -threshold, threshold)
    model_probability = 1 / (1 + returns_diff.exp())
    return noise_prob * 0.5 + (1 - noise_prob) * model_probability


class PreferenceTask:
    """Forward and loss of pair chunks for one reward net.

    Its metric (summed over pairs) is ``accuracy``.

    Args:
        net: The reward net (``preprocess`` then ``forward`` per call).
        noise_prob: As in imitation's ``PreferenceModel``.
        discount_factor: As in imitation's ``PreferenceModel``.
        threshold: As in imitation's ``PreferenceModel``.
        forward_size: Transitions per reward-net call (set before use).
    """

    metric_names = ("accuracy",)

    def __init__(
        self,
        net: reward_nets.RewardNet,
        *,
        noise_prob: float,
        discount_factor: float,
        threshold: float,
        forward_size: int = 1,
    ) -> None:
        self.net = net
        self.noise_prob = noise_prob
        self.discount_factor = discount_factor
        self.threshold = threshold
        self.forward_size = forward_size

    @property
    def device(self) -> th.device:
        """The reward net's device."""
        return self.net.device

    def make_chunk(self, pairs: Sequence[Pair], preferences: np.ndarray) -> PairChunk:
        """Lays out ``pairs`` and moves their preferences to the device."""
        layout = fragments.FragmentLayout.of(fragments.pair_fragments(pairs))
        discounts = None
        if self.discount_factor != 1:
            weights = layout.discount_weights(self.discount_factor)
            discounts = th.as_tensor(weights, device=self.device)
        prefs = th.as_tensor(preferences, dtype=th.float32, device=self.device)
        return PairChunk(layout, prefs, discounts)

    def call(
        self, layout: fragments.FragmentLayout, start: int, stop: int
    ) -> th.Tensor:
        """One reward-net call on transitions ``[start, stop)`` of ``layout``."""
        # Frames travel to the device as stored (uint8) and are converted there;
        # RewardNet.preprocess accepts tensors as well as arrays.
        obs, acts, next_obs, dones = (
            util.safe_to_tensor(x).to(self.device) for x in layout.gather(start, stop)
        )
        state, action, next_state, done = self.net.preprocess(
            obs,  # type: ignore[arg-type]
            acts,  # type: ignore[arg-type]
            next_obs,  # type: ignore[arg-type]
            dones,  # type: ignore[arg-type]
        )
        rewards = self.net(state, action, next_state, done)
        if rewards.shape != (stop - start,):
            raise ValueError(
                f"reward net returned shape {tuple(rewards.shape)} for "
                f"{stop - start} transitions; expected ({stop - start},)",
            )
        return rewards

    def forward(self, chunk: PairChunk) -> th.Tensor:
        """Per-transition rewards of every fragment of ``chunk``."""
        total = chunk.layout.n_transitions
        outputs = [
            self.call(chunk.layout, start, min(start + self.forward_size, total))
            for start in range(0, total, self.forward_size)
        ]
        return outputs[0] if len(outputs) == 1 else th.cat(outputs)

    def probabilities(self, chunk: PairChunk, rewards: th.Tensor) -> th.Tensor:
        """Probability that each pair's first fragment is preferred."""
        if chunk.discounts is not None:
            rewards = rewards * chunk.discounts
        returns = chunk.layout.segment_sums(rewards)
        return probability_first_preferred(
            returns[0::2],
            returns[1::2],
            self.noise_prob,
            self.threshold,
        )

    def loss(self, chunk: PairChunk, outputs: th.Tensor) -> accumulation.ChunkLoss:
        """Per-pair cross-entropy losses and correct-prediction counts."""
        probs = self.probabilities(chunk, outputs)
        losses = F.binary_cross_entropy(probs, chunk.preferences, reduction="none")
        correct = ((probs > 0.5) == (chunk.preferences > 0.5)).sum()
        return accumulation.ChunkLoss(
            loss_sum=losses.sum(),
            item_losses=losses.detach(),
            metric_sums={"accuracy": correct.detach()},
        )

    def ground_truth_loss(
        self,
        pairs: Sequence[Pair],
        preferences: np.ndarray,
    ) -> Optional[float]:
        """Imitation's ``gt_reward_loss``: the loss the true rewards would get.

        Args:
            pairs: The batch's pairs.
            preferences: Their preferences.

        Returns:
            The mean cross-entropy of the ground-truth preference probabilities, or
            ``None`` if some fragment has no rewards.
        """
        frags = fragments.pair_fragments(pairs)
        if not all(isinstance(f, types.TrajectoryWithRew) for f in frags):
            return None
        layout = fragments.FragmentLayout.of(frags)
        rews = th.as_tensor(
            np.concatenate([f.rews for f in frags]),  # type: ignore[attr-defined]
            dtype=th.float32,
        )
        if self.discount_factor != 1:
            rews = rews * th.as_tensor(layout.discount_weights(self.discount_factor))
        returns = layout.segment_sums(rews)
        probs = probability_first_preferred(
            returns[0::2],
            returns[1::2],
            self.noise_prob,
            self.threshold,
        )
        target = th.as_tensor(preferences, dtype=th.float32)
        return float(F.binary_cross_entropy(probs, target))


def task_for(
    preference_model: preference_comparisons.PreferenceModel,
) -> PreferenceTask:
    """A task that computes what ``preference_model`` defines."""
    return PreferenceTask(
        preference_model.model,
        noise_prob=preference_model.noise_prob,
        discount_factor=preference_model.discount_factor,
        threshold=preference_model.threshold,
    )
