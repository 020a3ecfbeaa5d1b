"""Whole-dataset checks of preference pairs against an environment's spaces.

Run before the first step, so that a bad pair (wrong shape, action out of range,
NaN observation) is named by its index in the file before any parameter changes.
"""

from typing import Any, List, Optional, Sequence

import gymnasium as gym
import numpy as np

#: At most this many problems are listed in one error message.
MAX_LISTED = 5


def _fragment_problems(
    fragment: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> List[str]:
    """What is wrong with one fragment, in words (empty: nothing)."""
    obs, acts = getattr(fragment, "obs", None), getattr(fragment, "acts", None)
    if any(value is None or isinstance(value, dict) for value in (obs, acts)):
        return ["is not a trajectory with array obs and acts"]
    obs, acts = np.asarray(obs), np.asarray(acts)
    problems = []
    obs_shape = tuple(observation_space.shape or ())
    if tuple(obs.shape[1:]) != obs_shape:
        problems.append(
            f"has observations of shape {tuple(obs.shape[1:])}, the environment "
            f"{obs_shape}"
        )
    elif np.issubdtype(obs.dtype, np.floating) and not np.isfinite(obs).all():
        step = int(np.argwhere(~np.isfinite(obs))[0][0])
        problems.append(f"has a non-finite observation (step {step})")
    if len(obs) != len(acts) + 1:
        problems.append(
            f"has {len(obs)} observations for {len(acts)} actions (one more expected)"
        )
    act_shape = tuple(action_space.shape or ())
    if tuple(acts.shape[1:]) != act_shape:
        problems.append(
            f"has actions of shape {tuple(acts.shape[1:])}, the environment {act_shape}"
        )
        return problems
    integral = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
    if isinstance(action_space, integral) and not np.issubdtype(acts.dtype, np.integer):
        problems.append(
            f"has {acts.dtype} actions for the environment's "
            f"{type(action_space).__name__} space (integers expected)"
        )
        return problems
    outside = _outside(acts, action_space)
    if outside is not None and outside.any():
        step = int(np.argwhere(outside.reshape(len(acts), -1).any(axis=1))[0][0])
        problems.append(
            f"has an action outside the environment's action space {action_space} "
            f"(step {step}: {acts[step].tolist()!r})"
        )
    return problems


def _outside(acts: np.ndarray, space: gym.Space) -> Optional[np.ndarray]:
    """Which action entries lie outside ``space`` (``None``: not checked)."""
    if isinstance(space, gym.spaces.Discrete):
        offset = acts - space.start
        return (offset < 0) | (offset >= space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (acts < 0) | (acts >= space.nvec)
    if isinstance(space, gym.spaces.MultiBinary):
        return (acts != 0) & (acts != 1)
    if isinstance(space, gym.spaces.Box):
        with np.errstate(invalid="ignore"):
            return ~np.isfinite(acts) | (acts < space.low) | (acts > space.high)
    return None


def pair_problems(
    pair: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> List[str]:
    """What is wrong with one ``((fragment1, fragment2), preference)`` item.

    Returns:
        The problems, in words (empty if the pair fits the spaces).
    """
    try:
        (first, second), preference = pair
    except (TypeError, ValueError):
        return ["is not ((fragment1, fragment2), preference)"]
    problems = []
    for side, fragment in (("fragment 1", first), ("fragment 2", second)):
        found = _fragment_problems(fragment, observation_space, action_space)
        problems += [f"{side} {problem}" for problem in found]
    value = np.asarray(preference, dtype=np.float64)
    if value.shape != () or not np.isfinite(value) or not 0 <= value <= 1:
        problems.append(f"has preference {value.tolist()!r} (in [0, 1] expected)")
    return problems


def check_dataset(
    dataset: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    name: str = "dataset",
    environment: str = "the environment",
    indices: Optional[Sequence[int]] = None,
    hint: str = "",
) -> None:
    """Checks every pair of ``dataset`` against the environment's spaces.

    Args:
        dataset: Items ``((fragment1, fragment2), preference)``, such as
            imitation's ``PreferenceDataset`` (the whole file, not a subset,
            unless ``indices`` say where its items are).
        observation_space: The environment's observation space.
        action_space: The environment's action space.
        name: What the dataset is, for messages (``dataset_path='...'``).
        environment: What the environment is, for messages.
        indices: The file's index of each item, if ``dataset`` is a subset
            (default: the item's own index).
        hint: What to do about a mismatch, appended to the message.

    Raises:
        ValueError: if the dataset is empty, or naming (by index) up to
            :data:`MAX_LISTED` pairs that do not fit and how many do not.
    """
    n_pairs = len(dataset)
    if n_pairs == 0:
        raise ValueError(f"{name} holds no preference pairs")
    found: List[str] = []
    n_bad = 0
    for position in range(n_pairs):
        problems = pair_problems(dataset[position], observation_space, action_space)
        if problems:
            n_bad += 1
            if len(found) < MAX_LISTED:
                index = position if indices is None else int(indices[position])
                found.append(f"pair {index}: {'; '.join(problems)}")
    if n_bad:
        listed = "\n  ".join(found)
        more = f"\n  ... and {n_bad - len(found)} more" if n_bad > len(found) else ""
        raise ValueError(
            f"{name}: {n_bad} of {n_pairs} pairs do not fit {environment} "
            f"(observation space {observation_space}, action space "
            f"{action_space}):\n  {listed}{more}{hint}",
        )
