"""Every config value is checked in the config hook, before anything is written."""
# ruff: noqa: F811  (preferences_path is a fixture imported from the run tests)

import logging
import pathlib
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards import reward_nets
from imitation.util import util
from sacred import initialize

from imitation_accum import CrossEntropyRewardTrainer
from imitation_accum.integrations.patching import patched
from imitation_accum.scripts import experiment
from imitation_accum.scripts import train_reward_model as script
from imitation_accum.scripts.train_adversarial import train_adversarial_ex
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex,
)
from tests.scripts.helpers import largest_memory_bytes
from tests.scripts.test_train_reward_model import (  # noqa: F401
    preferences_path,
    run,
)

ex = script.train_reward_model_ex
TOO_MUCH = f"{largest_memory_bytes() * 4}"

BAD_REWARD_MODEL_VALUES = [
    (
        "reward_trainer_kwargs.max_grad_norm",
        -1,
        r"reward_trainer_kwargs\.max_grad_norm",
    ),
    ("reward_trainer_kwargs.lr", float("nan"), r"reward_trainer_kwargs\.lr"),
    ("reward_trainer_kwargs.forward_size", 0, r"reward_trainer_kwargs\.forward_size"),
    ("reward_trainer_kwargs.memory_budget", "6 GB?", r"kwargs\.memory_budget='6 GB\?'"),
    ("reward_trainer_kwargs.autocast_dtype", "fp8", r"kwargs\.autocast_dtype must be"),
    (
        "reward_trainer_kwargs.optimizer_kwargs",
        {"weight_decy": 0.1},
        r"optimizer_kwargs\.weight_decy: AdamW has no argument.*weight_decay",
    ),
    ("preference_model_kwargs.noise_prob", 2, r"preference_model_kwargs\.noise_prob"),
    (
        "preference_model_kwargs.discount_factor",
        -1,
        r"preference_model_kwargs\.discount_factor must be a number in \[0, 1\]",
    ),
    ("preference_model_kwargs.discount_factor", float("nan"), r"discount_factor"),
    ("preference_model_kwargs.noise_prb", 0.1, r"noise_prb.*did you mean noise_prob"),
    ("regularizer.kindd", "lp", r"regularizer\.kindd.*did you mean kind\?"),
    ("regularizer.initial_lambda", -1.0, r"regularizer\.initial_lambda"),
    ("reward.net_cls", "foo", r"reward\.net_cls='foo' is not an imitation RewardNet"),
    ("reward.net_kwargs.hid_sizes", [-1], r"reward\.net_kwargs\.hid_sizes"),
    ("device", "gpu0", r"device='gpu0' is not a device"),
]


#: Values of the wrong type: a ``TypeError`` naming the key.
WRONG_TYPE_REWARD_MODEL_VALUES = [
    ("reward_trainer_kwargs.lr", "fast", r"reward_trainer_kwargs\.lr"),
    (
        "reward_trainer_kwargs.progress_bar",
        "no",
        r"kwargs\.progress_bar must be a bool",
    ),
    ("reward_trainer_kwargs.optimizer_kwargs", 3, r"kwargs\.optimizer_kwargs must be"),
    ("held_out_seed", "x", r"held_out_seed must be an int >= 0, got 'x'"),
    ("reward_trainer_kwargs.drop_last", "false", r"kwargs\.drop_last must be"),
    ("environment.parallel", "no", r"environment\.parallel must be a bool"),
    ("seed", "abc", r"seed must be an int >= 0, got 'abc'"),
]


@pytest.mark.parametrize(
    ("key", "value", "error", "match"),
    [(*case[:2], ValueError, case[2]) for case in BAD_REWARD_MODEL_VALUES]
    + [(*case[:2], TypeError, case[2]) for case in WRONG_TYPE_REWARD_MODEL_VALUES],
)
def test_bad_value_named_before_the_run_directory(
    tmp_path,
    preferences_path,
    key,
    value,
    error,
    match,
):
    with pytest.raises(error, match=match):
        run(tmp_path, preferences_path, "bad", **{key: value})
    assert not (tmp_path / "bad").exists()


def test_regularizer_values_checked_when_it_is_on(tmp_path, preferences_path):
    with pytest.raises(ValueError, match=r"regularizer\.scaling_factor=1\.5"):
        run(
            tmp_path,
            preferences_path,
            **{"regularizer.kind": "lp", "regularizer.scaling_factor": 1.5},
        )


def test_bad_value_on_resume_keeps_the_earlier_log(tmp_path, preferences_path):
    csv = {"logging.log_format_strs": ["csv"]}
    first = run(tmp_path, preferences_path, "same", **csv)
    progress = tmp_path / "same" / "log" / "progress.csv"
    before = progress.read_bytes()
    assert before.count(b"\n") == 3  # a header and a row per epoch
    with pytest.raises(ValueError, match=r"reward_trainer_kwargs\.max_grad_norm"):
        run(
            tmp_path,
            preferences_path,
            "same",
            resume_from=first["training_state"],
            **{"reward_trainer_kwargs.max_grad_norm": -1},
            **csv,
        )
    assert progress.read_bytes() == before


def test_budget_beyond_the_device_refused_before_the_run_directory(
    tmp_path, preferences_path
):
    key = "reward_trainer_kwargs.memory_budget"
    match = r"reward_trainer_kwargs\.memory_budget=.* is more than the cpu device"
    with pytest.raises(ValueError, match=match):
        run(tmp_path, preferences_path, "big", **{key: TOO_MUCH, "device": "cpu"})
    assert not (tmp_path / "big").exists()


def test_budget_beyond_the_device_only_warned_by_print_config(caplog):
    key = "reward_trainer_kwargs.memory_budget"
    ex.run(
        "print_config",
        config_updates={key: TOO_MUCH, "reward_trainer_kwargs.minibatch_size": None},
    )
    warned = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(warned) == 1 and "this command does not train" in warned[0]


class _WritesMarker:
    """Unpickles by writing a file: what a crafted pickle's code could do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.write_text, (pathlib.Path(self.path), "ran"))


@pytest.fixture
def crafted_pickle(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_WritesMarker(marker)))
    return path, marker


@pytest.mark.parametrize("value", ["false", "False", "no", "maybe", 0, None])
def test_trust_pickle_takes_only_a_bool(tmp_path, crafted_pickle, value):
    path, marker = crafted_pickle
    with pytest.raises(TypeError, match=r"trust_pickle must be a bool"):
        run(tmp_path, path, "evil", trust_pickle=value)
    assert not marker.exists()
    assert not (tmp_path / "evil").exists()


def test_trust_pickle_false_on_the_command_line_runs_no_pickle(crafted_pickle):
    path, marker = crafted_pickle
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "imitation_accum.scripts.train_reward_model",
            "with",
            f"dataset_path={path}",
            "trust_pickle=false",  # sacred passes the string 'false'
        ],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "trust_pickle must be a bool (True or False), got 'false'" in done.stderr
    assert not marker.exists()
    assert not (path.parent / "output").exists()


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (
            "reward_trainer_kwargs.optimizer_kwargs",
            {"weight_decay": -1},
            r"optimizer_kwargs\.weight_decay=-1 refused by AdamW: ValueError: "
            r"Invalid weight_decay value: -1",
        ),
        ("device", "cuda:99", r"device='cuda:99': this machine has"),
        (
            "reward_trainer_kwargs.activation_checkpointing",
            True,
            r"activation_checkpointing=True: reward\.net_cls=BasicRewardNet has no",
        ),
        (
            "reward_trainer_kwargs.memory_budget",
            "100B",
            r"memory_budget=100 B is smaller than",
        ),
    ],
)
def test_more_bad_values_named_before_the_run_directory(
    tmp_path, preferences_path, key, value, match
):
    with pytest.raises(ValueError, match=match):
        run(tmp_path, preferences_path, "bad", **{key: value})
    assert not (tmp_path / "bad").exists()


@pytest.fixture
def _no_environment(monkeypatch, tmp_path):
    def make_vec_env(*args, **kwargs):
        raise AssertionError("an environment was built before the config was checked")

    monkeypatch.setattr(util, "make_vec_env", make_vec_env)
    monkeypatch.chdir(tmp_path)


def configured(ex_, command, named_configs, updates):
    """The config of a run of ``command``, hooks run, nothing built or started."""
    updates = experiment.user_alternatives_win(updates, ex_.alternatives)
    with patched():
        return initialize.create_run(ex_, command, updates, named_configs).config


@pytest.mark.usefixtures("_no_environment")
@pytest.mark.parametrize("named_config", ["fast", "atari_pong"])
def test_given_minibatch_alias_overrides_the_named_config(tmp_path, named_config):
    demos = {"source": "local", "path": str(tmp_path)}
    config = configured(
        train_adversarial_ex,
        "airl",
        [named_config],
        {"algorithm_kwargs": {"minibatch_size": 3}, "demonstrations": demos},
    )
    kwargs = config["algorithm_kwargs"]
    assert kwargs["minibatch_size"] == 3 and kwargs["demo_minibatch_size"] is None


@pytest.mark.usefixtures("_no_environment")
def test_given_budget_overrides_the_named_minibatch():
    config = configured(
        train_preference_comparisons_ex,
        "train_preference_comparisons",
        ["atari_pong"],
        {"reward_trainer_kwargs.memory_budget": "1GiB"},
    )
    kwargs = config["reward_trainer_kwargs"]
    assert kwargs["memory_budget"] == "1GiB" and kwargs["minibatch_size"] is None


@pytest.mark.usefixtures("_no_environment")
def test_two_given_alternatives_clash_in_the_hook(tmp_path):
    demos = {"source": "local", "path": str(tmp_path)}
    with pytest.raises(ValueError, match=r"algorithm_kwargs\.demo_minibatch_size=2 "):
        configured(
            train_adversarial_ex,
            "gail",
            ["fast"],
            {
                "algorithm_kwargs": {"minibatch_size": 3, "demo_minibatch_size": 2},
                "demonstrations": demos,
            },
        )


@pytest.mark.usefixtures("_no_environment")
@pytest.mark.parametrize(
    ("updates", "error", "match"),
    [
        (
            {"total_timesteps": "lots"},
            TypeError,
            r"total_timesteps must be a positive int",
        ),
        (
            {"algorithm_kwargs.max_grad_norm": 0},
            ValueError,
            r"algorithm_kwargs\.max_grad_norm",
        ),
    ],
)
def test_bad_adversarial_values_named(tmp_path, updates, error, match):
    demos = {"demonstrations.source": "local", "demonstrations.path": str(tmp_path)}
    with pytest.raises(error, match=match):
        configured(train_adversarial_ex, "airl", ["fast"], {**updates, **demos})


@pytest.mark.usefixtures("_no_environment")
@pytest.mark.parametrize(
    ("updates", "error", "match"),
    [
        ({"total_timesteps": "lots"}, TypeError, r"total_timesteps must be a pos"),
        ({"total_timesteps": 1e3}, None, None),
        ({"preference_model_kwargs.noise_prob": 2}, ValueError, r"noise_prob must"),
        ({"reward_trainer_kwargs.lr": -1}, ValueError, r"trainer_kwargs\.lr must be"),
    ],
)
def test_bad_preference_comparisons_values_named(updates, error, match):
    def configure():
        return configured(
            train_preference_comparisons_ex,
            "train_preference_comparisons",
            ["fast"],
            updates,
        )

    if error is None:
        assert configure()["total_timesteps"] == 1000
        return
    with pytest.raises(error, match=match):
        configure()


def test_trainer_rejects_an_inverting_preference_model():
    net = reward_nets.BasicRewardNet(
        gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2)
    )
    model = pc.PreferenceModel(net, noise_prob=2)
    with pytest.raises(ValueError, match=r"preference_model\.noise_prob must be"):
        CrossEntropyRewardTrainer(
            model, pc.CrossEntropyRewardLoss(), np.random.default_rng(0)
        )


# --- the whole dataset, before the first step --------------------------------


def test_empty_dataset_is_named(tmp_path):
    path = tmp_path / "empty.pkl"
    pc.PreferenceDataset().save(path)
    with pytest.raises(ValueError, match=r"empty\.pkl' holds no preference pairs"):
        run(tmp_path, path, "empty")
    assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize("part", ["train", "held_out"])
def test_a_bad_pair_is_named_by_its_file_index(tmp_path, preferences_path, part):
    data = pc.PreferenceDataset.load(preferences_path)
    train, held_out = script.split_held_out(len(data), 0.25, 0)
    index = int((train if part == "train" else held_out)[-1])
    bad = data.fragments2[index]
    bad.obs[3, 0] = np.nan
    path = tmp_path / "bad.pkl"
    data.save(path)
    with pytest.raises(ValueError) as error:
        run(tmp_path, path, "bad")
    assert (
        "1 of 40 pairs do not fit what environment.gym_id='seals/CartPole-v0' gives"
        in str(error.value)
    )
    assert f"\n  pair {index}: fragment 2 has a non-finite observation (step 3)" in str(
        error.value
    )
    assert not (tmp_path / "bad").exists()


# --- warnings the user cannot act on ------------------------------------------


def test_sacred_warnings_about_own_keys_left_out(caplog):
    ex.run("print_config", config_updates={"reward_trainer_kwargs.forward_size": 8})
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "config entry" in m], messages
    quiet = experiment._OwnKeysFilter(["reward_trainer_kwargs"])

    def kept(message):
        return quiet.filter(logging.LogRecord("x", 30, "", 0, message, (), None))

    assert not kept('Changed type of config entry "reward_trainer_kwargs.lr" from a')
    assert kept('Added new config entry: "rl.rl_kwargs.foo"')  # a real one stays
    assert kept("something else")


def test_importing_the_package_warns_nothing_of_its_own():
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import imitation_accum"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pkg_resources is deprecated" not in done.stderr
