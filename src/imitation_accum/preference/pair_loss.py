"""Imitation's preference model and its cross-entropy, vectorized over pairs."""

from typing import Tuple

import torch as th
from torch.nn import functional as F  # noqa: N812


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

    The binary cross-entropy between ``preferences`` and
    :func:`probability_first_preferred`. Without noise it is computed from the
    logit, which is stable where the probability rounds to 0 or 1; with noise the
    probability stays within ``[noise_prob / 2, 1 - noise_prob / 2]``. Unlike
    ``F.binary_cross_entropy``, a non-finite return gives a non-finite loss
    rather than an exception, so the engine can discard the step.

    Args:
        returns_a: Returns of the first fragments.
        returns_b: Returns of the second fragments.
        preferences: Probability that each first fragment is preferred.
        noise_prob: Probability that a preference is uniformly random.
        threshold: Return differences are clipped to ``[-threshold, threshold]``.

    Returns:
        The per-pair losses and the (detached) predicted probabilities.
    """
    if noise_prob == 0:
        # The logit of the first fragment being preferred: -clip(R_b - R_a).
        logits = th.clamp(returns_a - returns_b, -threshold, threshold)
        losses = F.binary_cross_entropy_with_logits(
            logits,
            preferences,
            reduction="none",
        )
        return losses, th.sigmoid(logits.detach())
    probs = probability_first_preferred(returns_a, returns_b, noise_prob, threshold)
    losses = -(preferences * th.log(probs) + (1 - preferences) * th.log1p(-probs))
    return losses, probs.detach()
