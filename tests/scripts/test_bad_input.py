"""A bad config is rejected, naming the key or path, before anything is built."""

import pytest
import sacred.utils
from imitation.util import util

from imitation_accum.scripts.train_adversarial import train_adversarial_ex
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex,
)


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch, tmp_path):
    """Fails a test that gets as far as building an environment."""

    def make_vec_env(*args, **kwargs):
        raise AssertionError("an environment was built before the config was checked")

    monkeypatch.setattr(util, "make_vec_env", make_vec_env)
    monkeypatch.chdir(tmp_path)


def run_pc(named_configs=("fast",), **updates):
    return train_preference_comparisons_ex.run(
        named_configs=list(named_configs),
        config_updates=updates,
    )


def test_unknown_named_config():
    with pytest.raises(sacred.utils.NamedConfigNotFoundError, match="atari_pongg"):
        run_pc(["atari_pongg"])


@pytest.mark.parametrize(
    ("key", "near"),
    [("minibtch_size", "minibatch_size"), ("batchsize", "batch_size")],
)
def test_misspelled_trainer_argument(key, near):
    with pytest.raises(ValueError, match=f"reward_trainer_kwargs.{key}.*{near}"):
        run_pc(reward_trainer_kwargs={key: 4})


@pytest.mark.parametrize("minibatch_size", [0, -3, 2.5, "4"])
def test_invalid_minibatch_size(minibatch_size):
    with pytest.raises(ValueError, match=r"reward_trainer_kwargs\.minibatch_size"):
        run_pc(reward_trainer_kwargs={"minibatch_size": minibatch_size})


def test_minibatch_larger_than_batch():
    with pytest.raises(
        ValueError,
        match=r"reward_trainer_kwargs.minibatch_size=64 must not exceed "
        r"reward_trainer_kwargs.batch_size=32",
    ):
        run_pc(reward_trainer_kwargs={"minibatch_size": 64})


@pytest.mark.parametrize(
    ("gym_id", "near"),
    [
        ("imitation_accum/PongNoFrameskip-v5", "imitation_accum/PongNoFrameskip-v4"),
        ("imitation_accum/PongNoFrameSkip-v4", "imitation_accum/PongNoFrameskip-v4"),
        ("imitation_accum/PacmanNoFrameskip-v4", None),
    ],
)
def test_unknown_atari_game(gym_id, near):
    match = f"environment.gym_id='{gym_id}' is not a registered environment"
    with pytest.raises(ValueError, match=match) as error:
        run_pc(["atari_pong", "fast"], environment={"gym_id": gym_id})
    if near:
        assert f"did you mean '{near}'" in str(error.value)


def test_game_without_score_mask_names_the_unmasked_id():
    with pytest.raises(ValueError, match="AsteroidsNoFrameskip-Unmasked-v4") as error:
        run_pc(
            ["atari_pong", "fast"],
            environment={"gym_id": "imitation_accum/AsteroidsNoFrameskip-v4"},
        )
    assert "Asteroids" in str(error.value)


def test_invalid_horizon():
    with pytest.raises(ValueError, match=r"environment\.max_episode_steps"):
        run_pc(environment={"max_episode_steps": 0})


def test_cnn_reward_net_with_input_normalization():
    from imitation.util import networks

    with pytest.raises(ValueError, match=r"reward\.net_kwargs\.normalize_input_layer"):
        run_pc(
            ["atari_pong", "fast"],
            reward={"net_kwargs": {"normalize_input_layer": networks.RunningNorm}},
        )


def run_adversarial(command="airl", named_configs=("fast",), **updates):
    return train_adversarial_ex.run(
        command,
        named_configs=list(named_configs),
        config_updates=updates,
    )


def test_missing_demonstrations_file(tmp_path):
    missing = str(tmp_path / "no-such-demos")
    with pytest.raises(ValueError, match=f"demonstrations.path='{missing}'"):
        run_adversarial(demonstrations={"source": "local", "path": missing})


def test_local_demonstrations_need_a_path():
    with pytest.raises(ValueError, match=r"demonstrations\.path"):
        run_adversarial("airl", ["atari_pong", "fast"])  # source=local, no path


@pytest.mark.parametrize("command", ["airl", "gail"])
def test_misspelled_algorithm_argument(command, tmp_path):
    with pytest.raises(ValueError, match=r"algorithm_kwargs\.demo_minibatchsize"):
        run_adversarial(
            command,
            algorithm_kwargs={"demo_minibatchsize": 2},
            demonstrations={"source": "local", "path": str(tmp_path)},
        )


def test_demo_minibatch_larger_than_demo_batch(tmp_path):
    with pytest.raises(ValueError, match=r"algorithm_kwargs\.demo_minibatch_size=8"):
        run_adversarial(
            "gail",
            algorithm_kwargs={"demo_minibatch_size": 8},
            demonstrations={"source": "local", "path": str(tmp_path)},
        )
