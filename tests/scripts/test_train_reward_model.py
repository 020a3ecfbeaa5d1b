"""The offline reward-model experiment: runs, resumes, rejects bad input, scales out."""

import os
import pathlib
import pickle
import subprocess
import sys
from typing import Any, Dict, List, Optional

import numpy as np
import pytest
import seals  # noqa: F401  (registers seals/CartPole-v0)
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import rollout
from imitation.rewards import reward_nets, serialize
from imitation.util import util

import imitation_accum
from imitation_accum import PreferenceDataset, checkpoint, distributed
from imitation_accum.distributed import process_group
from imitation_accum.scripts import train_reward_model as script
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex as preference_ex,
)
from tests import reference as ref
from tests.scripts import helpers

TORCHRUN_TIMEOUT_S = 300
ex = script.train_reward_model_ex


@pytest.fixture(scope="module")
def preferences_path(tmp_path_factory) -> pathlib.Path:
    """40 preferences gathered as imitation gathers them, saved by imitation."""
    rng = np.random.default_rng(0)
    venv = util.make_vec_env("seals/CartPole-v0", rng=rng, n_envs=2)
    try:
        trajectories = rollout.generate_trajectories(
            None,
            venv,
            rollout.make_min_timesteps(1000),
            rng=rng,
        )
    finally:
        venv.close()
    fragmenter = pc.RandomFragmenter(rng=rng, warning_threshold=0)
    pairs = fragmenter(trajectories, fragment_length=10, num_pairs=40)
    dataset = pc.PreferenceDataset()
    dataset.push(pairs, pc.SyntheticGatherer(rng=rng)(pairs))
    path = tmp_path_factory.mktemp("data") / "preferences.pkl"
    dataset.save(path)
    return path


def run(
    tmp_path: pathlib.Path,
    dataset: pathlib.Path,
    name: str = "run",
    **updates: Any,
) -> Dict[str, Any]:
    config = {
        "dataset_path": str(dataset),
        "trust_pickle": True,
        "seed": 7,
        "logging": {"log_dir": str(tmp_path / name), "log_format_strs": []},
    }
    for key, value in updates.items():
        target = config
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    result = ex.run(named_configs=["fast"], config_updates=config)
    assert result.status == "COMPLETED"
    return result.result


def held_out_loss(net, dataset_path, fraction, seed):
    """The mean cross-entropy of ``net`` on the held-out pairs, computed plainly."""
    dataset = pc.PreferenceDataset.load(dataset_path)
    _, held_out = script.split_held_out(len(dataset), fraction, seed)
    pairs, prefs = ref.batch_of(dataset, held_out)
    with th.no_grad():
        return float(ref.full_batch_loss(net.eval(), pairs, prefs))


def test_fast_run_reports_held_out_figures_and_saves(tmp_path, preferences_path):
    result = run(tmp_path, preferences_path)
    assert [h["epoch"] for h in result["held_out"]] == [1, 2]
    for figures in result["held_out"]:
        assert 0 <= figures["accuracy"] <= 1 and np.isfinite(figures["loss"])
    net = checkpoint.load_reward_net(result["reward_net"])
    assert result["reward_net"].endswith("run/checkpoints/final/reward_net.pt")
    # The last figure is the saved net's loss on the held-out pairs (10 of 40).
    expected = held_out_loss(net, preferences_path, 0.25, 0)
    assert result["held_out"][-1]["loss"] == pytest.approx(expected, rel=1e-5)
    state = checkpoint.load_training_state(result["training_state"])
    assert state.epoch == 2
    leftovers = list((tmp_path / "run" / "checkpoints").glob(".*"))
    assert leftovers == []


def test_resumed_run_equals_uninterrupted(tmp_path, preferences_path):
    first = run(
        tmp_path, preferences_path, "first", **{"reward_trainer_kwargs.epochs": 1}
    )
    resumed = run(
        tmp_path,
        preferences_path,
        "resumed",
        resume_from=first["training_state"],
    )
    whole = run(tmp_path, preferences_path, "whole")
    assert [h["epoch"] for h in resumed["held_out"]] == [2]
    assert resumed["held_out"][-1] == whole["held_out"][-1]
    a = checkpoint.load_reward_net(resumed["reward_net"]).state_dict()
    b = checkpoint.load_reward_net(whole["reward_net"]).state_dict()
    assert all(th.equal(a[k], b[k]) for k in b)
    # The resumed run trained one epoch: from the checkpoint, not from scratch.
    once = checkpoint.load_reward_net(first["reward_net"]).state_dict()
    assert not all(th.equal(once[k], b[k]) for k in b)


# --- bad input: a clear error naming the key or the path, before training ---


def test_missing_or_absent_dataset_is_named(tmp_path):
    with pytest.raises(ValueError, match="dataset_path is required"):
        ex.run(named_configs=["fast"])
    missing = tmp_path / "missing.pkl"
    with pytest.raises(ValueError, match=rf"dataset_path='{missing}': no such file"):
        run(tmp_path, missing)


def test_corrupt_dataset_is_named(tmp_path):
    corrupt = tmp_path / "corrupt.pkl"
    corrupt.write_bytes(os.urandom(64))
    with pytest.raises(ValueError, match=r"corrupt\.pkl' is not a readable"):
        run(tmp_path, corrupt)
    not_preferences = tmp_path / "dict.pkl"
    not_preferences.write_bytes(pickle.dumps({"pairs": []}))
    with pytest.raises(ValueError, match=r"dict\.pkl' holds a dict, not"):
        run(tmp_path, not_preferences)


def test_dataset_smaller_than_a_batch_is_named(tmp_path, preferences_path):
    with pytest.raises(ValueError, match=r"30 remain for training, fewer than one"):
        run(tmp_path, preferences_path, **{"reward_trainer_kwargs.batch_size": 31})


def test_batch_smaller_than_the_processes_is_named(
    tmp_path,
    preferences_path,
    monkeypatch,
):
    """Checked before any collective, so four pretended ranks suffice."""
    monkeypatch.setattr(
        process_group,
        "init_distributed",
        lambda device, **options: distributed.DistributedContext(world_size=4),
    )
    with pytest.raises(
        distributed.RankFailedError,
        match=r"reward_trainer_kwargs\.batch_size=2 is smaller than the number of "
        r"processes \(4\)",
    ):
        run(tmp_path, preferences_path, **{"reward_trainer_kwargs.batch_size": 2})
    assert not (tmp_path / "run").exists()


def test_checkpoint_of_another_architecture_is_named(tmp_path, preferences_path):
    first = run(
        tmp_path, preferences_path, "first", **{"reward_trainer_kwargs.epochs": 1}
    )
    with pytest.raises(ValueError, match=r"training_state\.pt': key '.*dense0\.weight"):
        run(
            tmp_path,
            preferences_path,
            "other",
            resume_from=first["training_state"],
            **{"reward.net_kwargs.hid_sizes": (4, 4)},
        )
    with pytest.raises(ValueError, match=r"resume_from=.* held_out_split"):
        run(
            tmp_path,
            preferences_path,
            "other_split",
            resume_from=first["training_state"],
            held_out_seed=1,
        )
    assert not (tmp_path / "other" / "checkpoints").exists()


def test_config_mistakes_are_named(tmp_path, preferences_path):
    with pytest.raises(ValueError, match=r"reward_trainer_kwargs\.minibatch:.*mean"):
        run(tmp_path, preferences_path, **{"reward_trainer_kwargs.minibatch": 2})
    with pytest.raises(ValueError, match=r"optimizer_cls='Adam W' is not"):
        run(
            tmp_path,
            preferences_path,
            **{"reward_trainer_kwargs.optimizer_cls": "Adam W"},
        )
    with pytest.raises(ValueError, match=r"environment\.gym_id='Pendulum-v1' gives"):
        run(tmp_path, preferences_path, **{"environment.gym_id": "Pendulum-v1"})
    with pytest.raises(ValueError, match=r"reward_trainer_kwargs\.epochs must be"):
        run(tmp_path, preferences_path, **{"reward_trainer_kwargs.epochs": 0})
    with pytest.raises(ValueError, match=r"held_out_fraction=1\.5"):
        run(tmp_path, preferences_path, held_out_fraction=1.5)


def test_regularizer_from_config(tmp_path, preferences_path):
    result = run(
        tmp_path,
        preferences_path,
        **{
            "regularizer.kind": "lp",
            "regularizer.scaling_factor": 0.5,
            "regularizer.val_split": 0.2,
        },
    )
    state = checkpoint.load_training_state(result["training_state"])
    assert state.regularizer_lambda is not None


# --- torchrun ---------------------------------------------------------------


def torchrun(
    tmp_path: pathlib.Path,
    entry: List[str],
    updates: List[str],
    env: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *entry,
        "with",
        "fast",
        *updates,
    ]
    return subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=TORCHRUN_TIMEOUT_S,
        check=False,
    )


def test_failing_rank_stops_the_job_and_names_itself(tmp_path, preferences_path):
    # Epochs of 30 training pairs in batches of 4: 8 steps. Rank 1 fails in the
    # second epoch, after the first epoch's checkpoint.
    done = torchrun(
        tmp_path,
        [str(pathlib.Path(__file__).with_name("failing_rank.py"))],
        [
            f"dataset_path={preferences_path}",
            "trust_pickle=True",
            f"logging.log_dir={tmp_path / 'run'}",
            "reward_trainer_kwargs.epochs=3",
        ],
        env={"FAIL_RANK": "1", "FAIL_AT_STEP": "11"},
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "rank 1 of 2 failed: RuntimeError: injected failure" in output
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["training_state.pt"]
    assert checkpoint.load_training_state(checkpoints / "training_state.pt").epoch == 1


def test_torchrun_two_ranks_equal_one_process(tmp_path, preferences_path):
    # 36 training pairs in batches of 7: shares of 4 and 3 pairs in minibatches
    # of 3, and a last batch of one pair, in which rank 1 has none.
    updates = {
        "held_out_fraction": 0.1,
        "reward_trainer_kwargs.batch_size": 7,
        "reward_trainer_kwargs.minibatch_size": 3,
        "reward_trainer_kwargs.optimizer_cls": "SGD",
        "reward_trainer_kwargs.lr": 0.05,
    }
    single = run(tmp_path, preferences_path, "single", **updates)
    done = torchrun(
        tmp_path,
        ["-m", "imitation_accum.scripts.train_reward_model"],
        [
            f"dataset_path={preferences_path}",
            "trust_pickle=True",
            f"logging.log_dir={tmp_path / 'ddp'}",
            "seed=7",
            *(f"{k}={v}" for k, v in updates.items()),
        ],
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    ddp = checkpoint.load_reward_net(tmp_path / "ddp/checkpoints/final/reward_net.pt")
    expected = checkpoint.load_reward_net(single["reward_net"])
    keys = sorted(expected.state_dict())
    error = ref.relative_error(
        [ddp.state_dict()[k] for k in keys],
        [expected.state_dict()[k] for k in keys],
    )
    assert error < 1e-6
    # Only rank 0 spoke and wrote: one sacred report, one observer directory.
    assert (done.stdout + done.stderr).count("Completed after") == 1
    assert sorted(p.name for p in (tmp_path / "output" / "sacred").rglob("config.json"))
    runs = list((tmp_path / "output" / "sacred" / "train_reward_model").iterdir())
    assert len([r for r in runs if r.name.isdigit()]) == 1


def test_trains_on_atari_preferences_saved_by_this_package(tmp_path):
    """Frames gathered by the preference experiment, retrained offline, reloaded."""
    gathered = helpers.run(
        preference_ex,
        tmp_path / "gather",
        ["atari_pong", "fast"],
        {
            "reward_trainer_kwargs": {"progress_bar": False, "forward_size": 4},
            "save_preferences": True,
        },
    )
    dataset_path = helpers.log_dir(gathered) / "preferences.pkl"
    dataset = PreferenceDataset.load(dataset_path)  # a frame store, under patch()
    assert dataset.fragments1[0].obs.dtype == np.uint8
    result = ex.run(
        named_configs=["atari_pong", "fast"],
        config_updates={
            "dataset_path": str(dataset_path),
            "logging": {"log_dir": str(tmp_path / "offline"), "log_format_strs": []},
        },
    )
    assert result.status == "COMPLETED"
    assert all(np.isfinite(h["loss"]) for h in result.result["held_out"])
    net = checkpoint.load_reward_net(result.result["reward_net"])
    assert any(isinstance(m, reward_nets.CnnRewardNet) for m in net.modules())
    # imitation's own loader reads it, patched (torch >= 2.6: weights_only).
    with imitation_accum.patched():
        reward_fn = serialize.load_reward(
            "RewardNet_unnormalized", result.result["reward_net"], None
        )
    frames = dataset.fragments1[0].obs[:3]
    rewards = reward_fn(frames, np.zeros(3, int), frames, np.zeros(3, bool))
    assert rewards.shape == (3,) and np.isfinite(rewards).all()
