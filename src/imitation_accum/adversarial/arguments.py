"""What an adversarial trainer is given: minibatch sizes, observation layouts."""

from typing import Any, Mapping, Optional

import gymnasium as gym
import torch as th
from stable_baselines3.common import preprocessing

from imitation_accum import _validation
from imitation_accum.planning import budget


def resolve_minibatch_size(
    demo_minibatch_size: object,
    minibatch_size: object,
    demo_batch_size: int,
    prefix: str = "",
) -> Optional[int]:
    """Checks ``demo_minibatch_size`` and its alias ``minibatch_size``.

    Args:
        demo_minibatch_size: imitation's name for the minibatch size.
        minibatch_size: The alias.
        demo_batch_size: The batch size the minibatch must not exceed.
        prefix: Prepended to each name in messages (``algorithm_kwargs.``).

    Returns:
        The minibatch size, or ``None`` for the whole batch.

    Raises:
        ValueError: if a given size is not a positive int, exceeds
            ``demo_batch_size``, or the two names are given different values.
    """
    given = {
        name: _validation.positive_int(name, value)
        for name, value in (
            (f"{prefix}demo_minibatch_size", demo_minibatch_size),
            (f"{prefix}minibatch_size", minibatch_size),
        )
        if value is not None
    }
    if len(set(given.values())) > 1:
        raise ValueError(
            f"{prefix}demo_minibatch_size={demo_minibatch_size!r} and "
            f"{prefix}minibatch_size={minibatch_size!r} disagree: minibatch_size "
            "is an alias of demo_minibatch_size; give one of them.",
        )
    if not given:
        return None
    name, value = next(iter(given.items()))
    _validation.minibatch_within_batch(
        name, value, f"{prefix}demo_batch_size", demo_batch_size
    )
    return value


def check_algorithm_values(kwargs: Mapping[str, Any], prefix: str = "") -> None:
    """Checks the values of an AIRL/GAIL trainer's keyword arguments.

    What the constructors check, checked from a config before anything is
    built, each message naming ``prefix + name``.

    Args:
        kwargs: Keyword arguments of ``imitation_accum.AIRL`` or ``GAIL``.
        prefix: Prepended to each name (``algorithm_kwargs.``).

    Raises:
        ValueError: naming the first invalid argument, or the minibatch size and
            memory budget given together.
    """
    batch = _validation.positive_int(
        f"{prefix}demo_batch_size", kwargs.get("demo_batch_size")
    )
    chunk = resolve_minibatch_size(
        kwargs.get("demo_minibatch_size"), kwargs.get("minibatch_size"), batch, prefix
    )
    parsed = budget.parse_budget(kwargs.get("memory_budget"), f"{prefix}memory_budget")
    if parsed is not None and chunk is not None:
        raise ValueError(
            f"{prefix}demo_minibatch_size (or minibatch_size)={chunk!r} and "
            f"{prefix}memory_budget={kwargs.get('memory_budget')!r} are "
            "alternatives: give one of them",
        )
    if kwargs.get("max_grad_norm") is not None:
        _validation.positive_finite_float(
            f"{prefix}max_grad_norm", kwargs["max_grad_norm"]
        )
    if "n_disc_updates_per_round" in kwargs:
        _validation.positive_int(
            f"{prefix}n_disc_updates_per_round", kwargs["n_disc_updates_per_round"]
        )
    if kwargs.get("gen_train_timesteps") is not None:
        _validation.positive_count(
            f"{prefix}gen_train_timesteps", kwargs["gen_train_timesteps"]
        )
    options = kwargs.get("disc_opt_kwargs")
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"{prefix}disc_opt_kwargs must be None or a dict")


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
