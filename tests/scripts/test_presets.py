"""The JSON presets in configs/: in sync with their table, and runnable."""

import pathlib

import gymnasium as gym
import numpy as np
import pytest
from imitation.data import types

from imitation_accum import PreferenceDataset
from imitation_accum.scripts import presets
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex as ex,
)
from tests.scripts import helpers

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def test_configs_match_the_table():
    on_disk = sorted(path.stem for path in CONFIGS.glob("*.json"))
    assert on_disk == sorted(presets.PRESETS)
    for name, preset in presets.PRESETS.items():
        text = (CONFIGS / f"{name}.json").read_text()
        stale = (
            f"configs/{name}.json is stale: python -m imitation_accum.scripts.presets"
        )
        assert text == presets.render(preset), stale


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_preset_loads_as_its_named_config(name):
    preset = presets.PRESETS[name]
    from_file = ex.run("print_config", named_configs=[str(CONFIGS / f"{name}.json")])
    from_named = ex.run("print_config", named_configs=[preset.named_config])
    kwargs = from_file.config["reward_trainer_kwargs"]
    if name.endswith("gb"):  # GPU presets size minibatches from a budget
        assert kwargs["minibatch_size"] is None
        assert kwargs["memory_budget"].endswith("GiB")
    else:
        assert kwargs["minibatch_size"] < kwargs["batch_size"]
    for key in ("environment", "policy", "reward"):
        if key not in preset.changes:
            assert from_file.config[key] == from_named.config[key]


def test_gpu_presets_differ_only_in_memory_budget():
    for base in ("atari_pong", "atari_pong_unwrapped"):
        configs = [
            p.config() for p in presets.PRESETS.values() if p.named_config == base
        ]
        configs = [c for c in configs if c["total_timesteps"] >= 10**6]
        assert len(configs) == 4
        budgets = [c["reward_trainer_kwargs"].pop("memory_budget") for c in configs]
        assert len(set(budgets)) == 4
        assert all(c == configs[0] for c in configs)


def test_quickstart_preset_runs_fast(tmp_path):
    run = helpers.run(
        ex,
        tmp_path,
        [str(CONFIGS / "pong_cpu_quickstart.json"), "fast"],
        {"reward_trainer_kwargs": {"progress_bar": False}},
    )
    kwargs = run.config["reward_trainer_kwargs"]
    assert kwargs["batch_size"] > kwargs["minibatch_size"]
    helpers.assert_finite_losses(helpers.progress(run), "train/loss")


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_preset_frames_fit_16_gib_of_host_memory(name):
    config = presets.PRESETS[name].config()
    frames = presets.config_host_memory_bytes(config)
    # Frames kept for preferences and for one iteration of agent training, leaving
    # 4 GiB for the processes themselves.
    assert frames["total"] < 12 * 2**30


def test_full_dataset_is_kept_in_the_frame_store():
    config = presets.preference_config("Pong")
    assert config["comparison_queue_size"] is None  # all 5,000
    dataset = presets.config_host_memory_bytes(config)["dataset"]
    # Measured: two of the configured environment's fragments pushed into a store.
    env = gym.make(config["environment"]["gym_id"])
    try:
        obs = [env.reset(seed=0)[0]]
        while len(obs) < 2 * config["fragment_length"] + 1:
            obs.append(env.step(env.action_space.sample())[0])
    finally:
        env.close()
    length = config["fragment_length"]

    def fragment(start: int) -> types.TrajectoryWithRew:
        return types.TrajectoryWithRew(
            obs=np.stack(obs[start : start + length + 1]),
            acts=np.zeros(length, dtype=np.int64),
            infos=None,
            terminal=False,
            rews=np.zeros(length, dtype=np.float32),
        )

    store = PreferenceDataset()
    store.push([(fragment(0), fragment(length))], np.array([0.5], np.float32))
    assert dataset == config["total_comparisons"] * store.nbytes["frames"]
    assert dataset < 8 * 10**9  # 7.3 GB where imitation's copies need 28.5 GB


def test_table_has_a_header(capsys):
    presets.main(["--table"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| preset |") and lines[1].startswith("|---|")
    assert len(lines) == 2 + len(presets.PRESETS)
    columns = lines[0].count("|")
    assert all(line.count("|") == columns for line in lines)


def test_quickstart_first_phase_is_short():
    # imitation's initial_epoch_multiplier=200 made it most of the run.
    assert presets.QUICKSTART.config()["initial_epoch_multiplier"] == 1
