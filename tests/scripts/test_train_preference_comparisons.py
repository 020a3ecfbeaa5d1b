"""Smoke tests: the preference-comparisons experiment and each of its named configs."""

import json

import numpy as np
import pytest
from imitation.rewards import reward_nets
from stable_baselines3 import PPO

import imitation_accum
from imitation_accum import checkpoint
from imitation_accum.scripts import presets
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex as ex,
)
from tests.scripts import helpers

QUIET = {"progress_bar": False, "forward_size": 4}


def test_fast_trains_with_this_package_trainer(tmp_path):
    run = helpers.run(
        ex,
        tmp_path,
        ["fast"],
        {"reward_trainer_kwargs": {"batch_size": 4, "minibatch_size": 2, **QUIET}},
    )
    assert np.isfinite(run.result["reward_loss"])
    log_dir = helpers.log_dir(run)
    assert (log_dir / "checkpoints" / "final" / "reward_net.pt").is_file()
    config = json.loads((log_dir / "config.json").read_text())
    assert config["reward_trainer_kwargs"]["minibatch_size"] == 2
    rows = helpers.progress(run)
    helpers.assert_finite_losses(rows, "train/loss")
    # Only this package's trainer logs minibatches per step: 5 pairs in batches of
    # 4 (two minibatches of 2) and 1 (one minibatch).
    final = rows[-1]
    assert final["reward/final/train/chunks_per_step"] == pytest.approx(1.5)


def test_trainer_arguments_are_config_keys(tmp_path):
    run = helpers.run(
        ex,
        tmp_path,
        ["fast"],
        {
            "reward_trainer_kwargs": {
                "batch_size": 2,
                "minibatch_size": 1,
                "max_grad_norm": 0.5,
                **QUIET,
            },
        },
    )
    rows = helpers.progress(run)
    # 5 pairs in batches of 2, 2 and 1, one pair per minibatch.
    assert rows[-1]["reward/final/train/chunks_per_step"] == pytest.approx(5 / 3)
    assert rows[-1]["reward/final/train/forward_size"] == 4


# The first reward training runs 5 epochs (the named configs'
# initial_epoch_multiplier): Pong's named config runs as is, the others with a
# narrower CNN to keep this fast.
# The games' configs differ only in the environment: by default Pong, Space
# Invaders and unwrapped Pong run; the other games with `-m expensive`.
NARROW = {"net_kwargs": {"hid_channels": (4,)}}
DEFAULT_GAMES = ("atari_pong", "atari_spaceinvaders")
ATARI = [
    *[
        pytest.param(
            name,
            (84, 84, 4),
            {} if name == "atari_pong" else NARROW,
            marks=() if name in DEFAULT_GAMES else pytest.mark.expensive,
        )
        for name in presets.GAMES
    ],
    ("atari_pong_unwrapped", (210, 160, 3), NARROW),
]


@pytest.mark.parametrize(("named_config", "frame_shape", "reward"), ATARI)
def test_atari_named_config(tmp_path, named_config, frame_shape, reward):
    run = helpers.run(
        ex,
        tmp_path,
        [named_config, "fast"],
        {
            "reward_trainer_kwargs": {"minibatch_size": 1, **QUIET},
            "reward": reward,
            "save_preferences": True,
        },
    )
    log_dir = helpers.log_dir(run)
    helpers.assert_finite_losses(helpers.progress(run), "train/loss")

    net = checkpoint.load_reward_net(log_dir / "checkpoints/final/reward_net.pt")
    assert isinstance(net, reward_nets.NormalizedRewardNet)
    assert isinstance(net.base, reward_nets.CnnRewardNet)
    assert net.observation_space.shape == frame_shape  # height, width, channels
    # The policy gets the same frames channel-first (SB3's VecTransposeImage).
    policy = PPO.load(log_dir / "checkpoints" / "final" / "policy" / "model.zip")
    height, width, channels = frame_shape
    assert policy.observation_space.shape == (channels, height, width)

    # Saved by imitation's code, under patch(): a frame store.
    dataset = imitation_accum.PreferenceDataset.load(log_dir / "preferences.pkl")
    stacked = sum(f.obs.nbytes for f in [*dataset.fragments1, *dataset.fragments2])
    if frame_shape[-1] == 4:  # frame stacks: each frame kept once
        assert dataset.nbytes["frames"] < stacked
    for fragment in dataset.fragments1 + dataset.fragments2:
        assert fragment.obs.dtype == np.uint8
        assert fragment.obs.shape[1:] == frame_shape


@pytest.mark.parametrize("named_config", [*presets.GAMES, "atari_pong_unwrapped"])
def test_atari_named_config_prints(named_config, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ex.run("print_config", named_configs=[named_config])
    assert "CnnRewardNet" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # no run directory for print_config


def test_imitation_reward_ensemble_named_config(tmp_path):
    run = helpers.run(
        ex,
        tmp_path,
        ["fast", "reward.reward_ensemble"],
        {"reward_trainer_kwargs": {"batch_size": 4, "minibatch_size": 3, **QUIET}},
    )
    net = checkpoint.load_reward_net(
        helpers.log_dir(run) / "checkpoints" / "final" / "reward_net.pt"
    )
    assert isinstance(net.base, reward_nets.RewardEnsemble)
    helpers.assert_finite_losses(helpers.progress(run), "train/loss")


def epochs_trained(run) -> int:
    """Epochs of the run's longest reward-training phase, from its CSV keys."""
    header = (helpers.log_dir(run) / "log" / "progress.csv").read_text().splitlines()
    keys = header[0].split(",")
    return 1 + max(
        int(key.split("epoch-")[1].split("/")[0]) for key in keys if "/epoch-" in key
    )


def test_initial_epoch_multiplier_sets_the_first_phase(tmp_path):
    run = helpers.run(
        ex,
        tmp_path,
        ["fast"],
        {"reward_trainer_kwargs": QUIET, "initial_epoch_multiplier": 3},
    )
    assert epochs_trained(run) == 3  # fast: epochs=1


@pytest.mark.parametrize(
    ("named_config", "multiplier"),
    [("fast", 200), ("atari_pong", 5), ("atari_pong_unwrapped", 5)],
)
def test_named_configs_choose_the_first_phase(named_config, multiplier):
    run = ex.run("print_config", named_configs=[named_config])
    assert run.config["initial_epoch_multiplier"] == multiplier


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        ("many", TypeError),
        (float("nan"), ValueError),
    ],
)
def test_bad_initial_epoch_multiplier_is_named(value, error):
    with pytest.raises(error, match="initial_epoch_multiplier"):
        ex.run("print_config", config_updates={"initial_epoch_multiplier": value})


def test_atari_named_configs_add_no_config_entry_warnings(caplog):
    # Sacred warns of entries a named config adds to imitation's kwargs dicts.
    ex.run("print_config", named_configs=["atari_pong"])
    added = [r.getMessage() for r in caplog.records if "Added new config" in r.msg]
    assert not added


def test_held_out_pairs_scores_the_final_net_on_fresh_pairs(tmp_path):
    # Pendulum's reward varies every step, so held-out pairs are not tied.
    updates = {
        "seed": 3,
        "environment": {"gym_id": "Pendulum-v1"},
        "reward_trainer_kwargs": {"batch_size": 4, "minibatch_size": 2, **QUIET},
    }
    run = helpers.run(ex, tmp_path, ["fast"], {**updates, "held_out_pairs": 6})
    assert run.result["held_out_non_tied_pairs"] == 6
    assert 0.0 <= run.result["held_out_accuracy"] <= 1.0
    # The same seed, the same figure; without the key, no figure.
    again = helpers.run(
        ex, tmp_path / "again", ["fast"], {**updates, "held_out_pairs": 6}
    )
    assert again.result["held_out_accuracy"] == run.result["held_out_accuracy"]
    off = helpers.run(ex, tmp_path / "off", ["fast"], updates)
    assert "held_out_accuracy" not in off.result
