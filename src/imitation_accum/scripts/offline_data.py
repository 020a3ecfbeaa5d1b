"""The offline reward-model experiment's data: loaded, checked, split, agreed.

``train_reward_model`` reads a saved preference dataset (a frame store or
imitation's pickle), checks every pair against the environment's spaces before
any step, holds out a seeded share of the pairs, and under ``torchrun`` checks
that every rank loaded the same data.
"""

import hashlib
import pathlib
import types
from typing import Any, Mapping, Tuple

import gymnasium as gym
import numpy as np
from imitation.algorithms import preference_comparisons as pc
from torch.utils import data as data_th

from imitation_accum import distributed
from imitation_accum.io import fingerprint
from imitation_accum.preference import dataset_checks
from imitation_accum.preference.dataset import (
    ImitationPreferenceDataset,
    PreferenceDataset,
    read_imitation_pickle,
)


def load_preference_dataset(
    path: str,
    trust_pickle: bool = False,
) -> pc.PreferenceDataset:
    """Opens a frame store, or loads a pickle saved by imitation's dataset.

    Args:
        path: A frame-store directory (:meth:`imitation_accum.PreferenceDataset.save`)
            or a pickle file (imitation's ``PreferenceDataset.save``).
        trust_pickle: Whether a pickle may be loaded (loading runs any code it
            holds).

    Returns:
        The dataset: a memory-mapped :class:`imitation_accum.PreferenceDataset`
        for a store, imitation's for a pickle.

    Raises:
        ValueError: naming ``path`` if it is missing, unreadable, a corrupt store
            (naming the file), not a ``PreferenceDataset``, or a pickle without
            ``trust_pickle``.
    """
    source = pathlib.Path(path)
    if source.is_dir():
        return PreferenceDataset.load(source)
    if not source.is_file():
        raise ValueError(f"dataset_path={path!r}: no such file")
    if not trust_pickle:
        raise ValueError(
            f"dataset_path={path!r} is a pickle, and loading a pickle runs any code "
            "it holds: set trust_pickle=True if you trust the file, or convert it "
            "once with python -m imitation_accum.scripts.convert_preferences "
            f"{path} OUT and train on OUT",
        )
    return read_imitation_pickle(source, f"dataset_path={path!r}")


def split_held_out(
    n_pairs: int,
    fraction: float,
    seed: int,
) -> Tuple[np.ndarray, np.ndarray]:
    """Splits ``range(n_pairs)`` into training and held-out pairs.

    Args:
        n_pairs: Pairs in the dataset.
        fraction: Share held out: ``int(n_pairs * fraction)`` pairs.
        seed: Seed of the split.

    Returns:
        ``(train_indices, held_out_indices)``, each sorted.

    Raises:
        ValueError: if a positive ``fraction`` holds out no pair.
    """
    n_held_out = int(n_pairs * fraction)
    if fraction > 0 and n_held_out == 0:
        raise ValueError(
            f"held_out_fraction={fraction} of {n_pairs} pairs holds out none; "
            "raise it, or set it to 0 to hold out nothing",
        )
    order = np.random.default_rng(seed).permutation(n_pairs)
    return np.sort(order[n_held_out:]), np.sort(order[:n_held_out])


def subset(
    dataset: pc.PreferenceDataset,
    indices: np.ndarray,
) -> pc.PreferenceDataset:
    """The pairs ``indices`` of ``dataset``, as a dataset of their own (no copies).

    A frame store gives a ``Subset`` of itself, which the trainers read from the
    store directly.

    Args:
        dataset: The whole dataset.
        indices: Which pairs, in order.

    Returns:
        A ``PreferenceDataset`` holding the same fragment objects.
    """
    if isinstance(dataset, PreferenceDataset):
        return data_th.Subset(dataset, indices.tolist())  # type: ignore[return-value]
    part = ImitationPreferenceDataset()
    part.fragments1 = [dataset.fragments1[i] for i in indices]
    part.fragments2 = [dataset.fragments2[i] for i in indices]
    part.preferences = np.asarray(dataset.preferences, dtype=np.float32)[indices]
    return part


def environment_spaces(config: Mapping[str, Any]) -> types.SimpleNamespace:
    """The observation and action spaces of ``environment.gym_id``.

    The reward ingredient only reads a venv's spaces; one environment, made and
    closed here, gives them without any vectorized environment or subprocess.
    """
    env = gym.make(config["gym_id"], **config["env_make_kwargs"])
    try:
        return types.SimpleNamespace(
            observation_space=env.observation_space,
            action_space=env.action_space,
        )
    finally:
        env.close()


def check_dataset(
    dataset: pc.PreferenceDataset,
    spaces: types.SimpleNamespace,
    path: str,
    gym_id: str,
) -> None:
    """Every pair of the file checked against the environment, before any step."""
    if isinstance(dataset, PreferenceDataset):
        # A store's frames are checked as a whole first, naming its frames file.
        dataset.check_observation_space(
            spaces.observation_space, f"dataset_path={path!r}"
        )
    dataset_checks.check_dataset(
        dataset,
        spaces.observation_space,
        spaces.action_space,
        name=f"dataset_path={path!r}",
        environment=f"what environment.gym_id={gym_id!r} gives",
        hint="\nSet environment.gym_id (and env_make_kwargs) to the environment "
        "the preferences came from, or fix the pairs named.",
    )


def split_digest(indices: np.ndarray) -> str:
    """A digest of a split's indices (a resumed run must hold out the same)."""
    return hashlib.sha256(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()


def same_data_on_every_rank(
    context: distributed.DistributedContext,
    dataset: Any,
    path: str,
) -> str:
    """The data's fingerprint, checked to be every rank's before training."""
    value = fingerprint.dataset_fingerprint(dataset)
    distributed.check_same_on_every_rank(
        context,
        "the data",
        value,
        shown=f"dataset_path={path!r}, fingerprint {value[:19]}",
        advice=": every rank must load the same dataset",
    )
    return value
