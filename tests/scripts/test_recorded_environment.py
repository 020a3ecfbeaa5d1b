"""A preference store records its environment; offline training reads it from there.

These tests use ``PreferenceDataset.save(path, env_id=...)`` and
``PreferenceDataset.env_id``.
"""

import pathlib

import numpy as np
import pytest
from imitation.algorithms import preference_comparisons as pc
from imitation.data import rollout
from imitation.util import util

from imitation_accum import PreferenceDataset
from imitation_accum.scripts import train_reward_model
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex,
)
from tests.scripts import helpers


def pendulum_store(path: pathlib.Path, env_id) -> pathlib.Path:
    """12 pairs of Pendulum-v1 fragments (3-d observations), saved as a store."""
    rng = np.random.default_rng(0)
    venv = util.make_vec_env("Pendulum-v1", rng=rng, n_envs=1)
    try:
        trajectories = rollout.generate_trajectories(
            None, venv, rollout.make_min_timesteps(200), rng=rng
        )
    finally:
        venv.close()
    pairs = pc.RandomFragmenter(rng=rng, warning_threshold=0)(
        trajectories, fragment_length=5, num_pairs=12
    )
    dataset = PreferenceDataset()
    dataset.push(pairs, pc.SyntheticGatherer(rng=rng)(pairs))
    dataset.save(path, env_id=env_id)
    return path


def train_offline(tmp_path: pathlib.Path, store: pathlib.Path, **environment):
    updates = {
        "dataset_path": str(store),
        "logging": {"log_dir": str(tmp_path / "offline"), "log_format_strs": []},
    }
    if environment:
        updates["environment"] = environment
    return train_reward_model.train_reward_model_ex.run(
        named_configs=["fast"], config_updates=updates
    )


def test_preference_experiment_records_its_environment(tmp_path):
    run = helpers.run(
        train_preference_comparisons_ex,
        tmp_path,
        ["fast"],
        {
            "environment": {"gym_id": "Pendulum-v1"},
            "reward_trainer_kwargs": {"progress_bar": False, "forward_size": 4},
            "initial_epoch_multiplier": 1,
            "save_preferences": True,
        },
    )
    store = helpers.log_dir(run) / "preferences.pkl"
    assert PreferenceDataset.load(store).env_id == "Pendulum-v1"
    # Offline training finds the environment without being told.
    assert train_offline(tmp_path, store).status == "COMPLETED"


def test_offline_training_uses_the_recorded_environment(tmp_path):
    store = pendulum_store(tmp_path / "store", "Pendulum-v1")
    # The config names none (imitation's default, seals/CartPole-v0, has 4-d
    # observations: the pairs would be rejected).
    assert train_offline(tmp_path, store).status == "COMPLETED"


def test_a_configured_environment_still_wins(tmp_path):
    store = pendulum_store(tmp_path / "store", "Pendulum-v1")
    # MountainCarContinuous-v0 has 2-d observations: the store's pairs are rejected.
    with pytest.raises(ValueError, match=r"observation space is float32 \(2,\)"):
        train_offline(tmp_path, store, gym_id="MountainCarContinuous-v0")


def test_a_store_without_environment_keeps_the_configured_one(tmp_path):
    store = pendulum_store(tmp_path / "store", None)
    with pytest.raises(ValueError, match=r"observation space is float32 \(4,\)"):
        train_offline(tmp_path, store)
