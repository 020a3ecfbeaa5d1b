"""What an adversarial trainer is given: minibatch sizes, observation layouts."""

from typing import Optional

import gymnasium as gym
import torch as th
from stable_baselines3.common import preprocessing

from imitation_accum import _validation


def resolve_minibatch_size(
    demo_minibatch_size: object,
    minibatch_size: object,
    demo_batch_size: int,
) -> Optional[int]:
    """Checks ``demo_minibatch_size`` and its alias ``minibatch_size``.

    Args:
        demo_minibatch_size: imitation's name for the minibatch size.
        minibatch_size: The alias.
        demo_batch_size: The batch size the minibatch must not exceed.

    Returns:
        The minibatch size, or ``None`` for the whole batch.

    Raises:
        ValueError: if a given size is not a positive int, exceeds
            ``demo_batch_size``, or the two names are given different values.
    """
    given = {
        name: _validation.positive_int(name, value)
        for name, value in (
            ("demo_minibatch_size", demo_minibatch_size),
            ("minibatch_size", minibatch_size),
        )
        if value is not None
    }
    if len(set(given.values())) > 1:
        raise ValueError(
            f"demo_minibatch_size={demo_minibatch_size!r} and "
            f"minibatch_size={minibatch_size!r} disagree: minibatch_size is an "
            "alias of demo_minibatch_size; give one of them.",
        )
    if not given:
        return None
    name, value = next(iter(given.items()))
    _validation.minibatch_within_batch(name, value, "demo_batch_size", demo_batch_size)
    return value


def policy_observations(obs: th.Tensor, space: gym.Space) -> th.Tensor:
    """Observations in the layout the generator policy reads.

    Stable-Baselines3 wraps a CNN policy's environment in ``VecTransposeImage``, so
    the policy reads (channels, height, width) frames while the environment, the
    replay buffer and the demonstrations hold (height, width, channels) frames.

    Args:
        obs: A batch of observations in the environment's layout.
        space: The policy's observation space.

    Returns:
        ``obs``, transposed to channels-first if the policy expects that.

    Raises:
        ValueError: if the observations fit the policy in neither layout.
    """
    shape = tuple(space.shape or ())
    if tuple(obs.shape[1:]) == shape:
        return obs
    if obs.ndim == 4 and preprocessing.is_image_space(space):
        transposed = obs.permute(0, 3, 1, 2)
        if tuple(transposed.shape[1:]) == shape:
            return transposed
    raise ValueError(
        f"observations of shape {tuple(obs.shape[1:])} do not fit the generator "
        f"policy's observation space {shape}, even with channels moved first",
    )
