"""A misspelt key, at any level, is refused by name before anything is written."""
# ruff: noqa: F811  (preferences_path is a fixture imported from the run tests)

import pathlib
import subprocess
import sys

import pytest
import sacred.utils
from imitation.util import util

from imitation_accum.scripts import config_checks
from imitation_accum.scripts.train_adversarial import train_adversarial_ex
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex,
)
from imitation_accum.scripts.train_reward_model import train_reward_model_ex
from tests.scripts.test_train_reward_model import (  # noqa: F401
    preferences_path,
    run,
)

EXPERIMENTS = {
    "train_preference_comparisons": (
        train_preference_comparisons_ex,
        "train_preference_comparisons",
    ),
    "airl": (train_adversarial_ex, "airl"),
    "gail": (train_adversarial_ex, "gail"),
    "train_reward_model": (train_reward_model_ex, "train_reward_model"),
}
CONFIGS = pathlib.Path(__file__).parents[2] / "configs"


@pytest.fixture(autouse=True)
def _nothing_built(monkeypatch, tmp_path):
    """Fails a test that gets as far as building an environment; runs in tmp_path."""

    def make_vec_env(*args, **kwargs):
        raise AssertionError("an environment was built before the config was checked")

    monkeypatch.setattr(util, "make_vec_env", make_vec_env)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
@pytest.mark.parametrize(
    ("updates", "named", "near"),
    [
        ({"seeed": 1}, "seeed", "seed"),
        ({"logging": {"log_dirr": "x"}}, r"logging\.log_dirr", "log_dir"),
        ({"environment": {"gym_idd": "x"}}, r"environment\.gym_idd", "gym_id"),
        ({"reward": {"net_clss": None}}, r"reward\.net_clss", "net_cls"),
        ({"logging.wandb.wandb_tagg": []}, r"logging\.wandb\.wandb_tagg", "wandb_tag"),
        ({"env_make_kwargs": {"foo": 1}}, r"env_make_kwargs\.foo", None),
    ],
    ids=["root", "logging", "environment", "reward", "nested_ingredient", "moved"],
)
def test_misspelt_key_refused_before_anything_is_written(
    tmp_path, experiment, updates, named, near
):
    ex, command = EXPERIMENTS[experiment]
    with pytest.raises(config_checks.UnknownConfigKeyError, match=named) as error:
        ex.run(command, config_updates=updates)
    if near is not None:
        assert f"did you mean {near}" in str(error.value)
    assert isinstance(error.value, sacred.utils.ConfigAddedError)  # as imitation's
    assert isinstance(error.value, ValueError)  # as the package's other checks
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("experiment", "key", "near"),
    [
        ("train_preference_comparisons", "total_timestep", "total_timesteps"),
        ("train_preference_comparisons", "initial_epoch_multiplie", "initial_epoch"),
        ("airl", "total_timestep", "total_timesteps"),
        ("gail", "checkpoint_intervall", "checkpoint_interval"),
        ("train_reward_model", "dataset_pth", "dataset_path"),
        ("train_reward_model", "held_out_fractio", "held_out_fraction"),
    ],
)
def test_top_level_typo_named_with_near_matches(tmp_path, experiment, key, near):
    # Before any hook: dataset_pth is named, not "dataset_path is required".
    ex, command = EXPERIMENTS[experiment]
    with pytest.raises(config_checks.UnknownConfigKeyError, match=near) as error:
        ex.run(command, config_updates={key: 1}, named_configs=["fast"])
    assert str(error.value).startswith(f"{key}: no such config key")
    assert list(tmp_path.iterdir()) == []


def test_named_config_file_with_a_typo_is_refused(tmp_path):
    path = tmp_path / "typo.json"
    path.write_text('{"reward_trainer_kwargs": {"epochs": 1}, "total_timestep": 5}')
    with pytest.raises(config_checks.UnknownConfigKeyError, match="total_timestep"):
        train_preference_comparisons_ex.run(named_configs=[str(path)])
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("experiment", sorted(EXPERIMENTS))
def test_every_named_config_and_config_file_passes(experiment):
    ex, _ = EXPERIMENTS[experiment]
    named = list(ex.gather_named_configs())
    assert named
    for name, _ in named:
        config_checks.check_known_keys(ex, {}, [name])
    if experiment == "train_preference_comparisons":
        for path in sorted(CONFIGS.glob("*.json")):
            config_checks.check_known_keys(ex, {}, [str(path)])
    # Deeper keys, in dicts handed to a callee, are the hooks' to check.
    config_checks.check_known_keys(
        ex, {"environment.env_make_kwargs.anything": 1, "seed": 3}, []
    )


def test_env_make_kwargs_of_the_seals_environment_checked():
    # seals' FixedHorizonCartPole passes **kwargs on to gymnasium's CartPoleEnv.
    with pytest.raises(ValueError, match=r"environment\.env_make_kwargs\.foo: "):
        train_preference_comparisons_ex.run(
            named_configs=["fast"],
            config_updates={"environment.env_make_kwargs.foo": 1},
        )


def test_env_make_kwargs_of_the_datasets_environment_checked_before_the_run(
    tmp_path, preferences_path
):
    with pytest.raises(ValueError, match=r"environment\.env_make_kwargs\.foo: "):
        run(tmp_path, preferences_path, "bad", **{"environment.env_make_kwargs.foo": 1})
    assert not (tmp_path / "bad").exists()


def test_command_line_prints_one_error_and_writes_nothing(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "imitation_accum.scripts.train_preference_comparisons",
            "with",
            "seals_cartpole",
            "total_timestep=2000",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode != 0
    assert "total_timestep: no such config key" in done.stderr
    assert "did you mean total_timesteps?" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []
