"""Runs that cannot mix data or hang: fingerprints across ranks and on resume."""
# ruff: noqa: F811  (preferences_path is a fixture imported from the run tests)

import pathlib

import numpy as np
import pytest
from imitation.algorithms import preference_comparisons as pc

from imitation_accum import PreferenceDataset, checkpoint
from imitation_accum.io import frame_store
from tests.scripts.test_train_reward_model import (  # noqa: F401
    preferences_path,
    run,
    torchrun,
)

HELPER = str(pathlib.Path(__file__).with_name("failing_rank.py"))


@pytest.fixture(scope="module")
def other_preferences_path(preferences_path, tmp_path_factory) -> pathlib.Path:
    """The same number of pairs and preferences; one frame differs."""
    data = pc.PreferenceDataset.load(preferences_path)
    data.fragments1[0].obs[0, 0] += 1.0
    path = tmp_path_factory.mktemp("other") / "preferences.pkl"
    data.save(path)
    return path


def fingerprint(dataset) -> str:
    return PreferenceDataset.of_pairs(dataset).fingerprint()


def test_fingerprint_tells_same_sized_datasets_apart(
    preferences_path, other_preferences_path
):
    same = pc.PreferenceDataset.load(preferences_path)
    a = fingerprint(same)
    assert a == fingerprint(pc.PreferenceDataset.load(preferences_path))
    assert a != fingerprint(pc.PreferenceDataset.load(other_preferences_path))
    flipped = pc.PreferenceDataset.load(preferences_path)
    flipped.preferences = 1 - np.asarray(flipped.preferences)
    assert a != fingerprint(flipped)


def test_a_pickle_and_its_store_have_one_fingerprint(preferences_path, tmp_path):
    data = pc.PreferenceDataset.load(preferences_path)
    store = PreferenceDataset.of_pairs(data)
    store.save(tmp_path / "store")
    assert fingerprint(data) == PreferenceDataset.load(tmp_path / "store").fingerprint()
    assert store.fingerprint() == frame_store.fingerprint_of(
        frame_store.read_manifest(tmp_path / "store")
    )


def test_fingerprint_of_a_plain_sequence_of_pairs(preferences_path):
    data = pc.PreferenceDataset.load(preferences_path)
    items = [data[i] for i in range(len(data))]
    assert fingerprint(items) == fingerprint(data)
    items[39] = ((items[39][0][1], items[39][0][0]), items[39][1])
    assert fingerprint(items) != fingerprint(data)


def test_resume_on_other_data_names_both_files(
    tmp_path, preferences_path, other_preferences_path
):
    first = run(
        tmp_path, preferences_path, "first", **{"reward_trainer_kwargs.epochs": 1}
    )
    with pytest.raises(ValueError) as error:
        run(
            tmp_path,
            other_preferences_path,
            "other",
            resume_from=first["training_state"],
        )
    message = str(error.value)
    assert f"trained on the data of {str(preferences_path)!r}" in message
    assert f"dataset_path={str(other_preferences_path)!r} holds other data" in message
    assert not (tmp_path / "other").exists()


def test_ranks_with_other_data_stop_before_training(
    tmp_path, preferences_path, other_preferences_path
):
    done = torchrun(
        tmp_path,
        [HELPER],
        [
            f"dataset_path={preferences_path}",
            "trust_pickle=True",
            f"logging.log_dir={tmp_path / 'run'}",
        ],
        env={"FAIL_RANK": "1", "OTHER_DATASET": str(other_preferences_path)},
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "the ranks disagree on the data" in output
    assert f"rank 1: dataset_path={str(other_preferences_path)!r}" in output
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_hung_rank_ends_the_job_naming_it(tmp_path, preferences_path):
    done = torchrun(
        tmp_path,
        [HELPER],
        [
            f"dataset_path={preferences_path}",
            "trust_pickle=True",
            f"logging.log_dir={tmp_path / 'run'}",
            "collective_timeout_s=5",
        ],
        env={"FAIL_RANK": "1", "FAIL_AT_STEP": "3", "FAIL_MODE": "hang"},
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert (
        "rank 0 of 2 failed: a collective timed out after 5 s: rank 1 did not reach "
        "it (stopped or stuck)"
    ) in output


def test_resume_applies_the_configured_lr(tmp_path, preferences_path):
    once = {"reward_trainer_kwargs.epochs": 1}
    first = run(tmp_path, preferences_path, "first", **once)
    saved = checkpoint.load_training_state(first["training_state"])
    assert saved.optimizer_state["param_groups"][0]["lr"] == 1e-3
    resumed = run(
        tmp_path,
        preferences_path,
        "resumed",
        resume_from=first["training_state"],
        **{
            "reward_trainer_kwargs.lr": 0.05,
            "reward_trainer_kwargs.optimizer_kwargs": {"weight_decay": 0.5},
        },
    )
    state = checkpoint.load_training_state(resumed["training_state"])
    group = state.optimizer_state["param_groups"][0]
    assert group["lr"] == 0.05 and group["weight_decay"] == 0.5
