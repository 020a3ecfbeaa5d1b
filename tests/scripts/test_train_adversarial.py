"""Smoke tests: the AIRL/GAIL experiment and each of its named configs."""

import json

import pytest
from imitation.rewards import reward_nets

import imitation_accum
from imitation_accum import checkpoint
from imitation_accum.adversarial import trainers as adversarial
from imitation_accum.integrations import demonstrations
from imitation_accum.nets.shaped import CnnShapedRewardNet
from imitation_accum.scripts import presets
from imitation_accum.scripts.train_adversarial import train_adversarial_ex as ex
from tests.scripts import helpers


@pytest.fixture
def disc_steps(monkeypatch):
    """Counts discriminator steps taken by this package's AIRL and GAIL."""
    calls = []
    train_disc = adversarial.AccumulatingAdversarialTrainer.train_disc

    def counting(self, **kwargs):
        calls.append(type(self))
        return train_disc(self, **kwargs)

    monkeypatch.setattr(
        adversarial.AccumulatingAdversarialTrainer, "train_disc", counting
    )
    return calls


def local_demos(tmp_path, gym_id):
    path = tmp_path / "demos"
    demonstrations.make_demonstrations(
        path,
        gym_id=gym_id,
        n_episodes=2,
        max_episode_steps=5,  # the fast named config's horizon
    )
    return {"source": "local", "path": str(path)}


@pytest.mark.parametrize("algorithm", ["airl", "gail"])
def test_fast_trains_with_this_package_discriminator(tmp_path, algorithm, disc_steps):
    run = helpers.run(
        ex,
        tmp_path,
        ["fast"],
        {
            "demonstrations": local_demos(tmp_path, "seals/CartPole-v0"),
            "algorithm_kwargs": {"demo_minibatch_size": 3, "max_grad_norm": 1.0},
        },
        command_name=algorithm,
    )
    # The experiment trains a resumable subclass of this package's class.
    assert disc_steps and all(issubclass(c, ex_class(algorithm)) for c in disc_steps)
    final = helpers.log_dir(run) / "checkpoints" / "final"
    for name in ("reward_train.pt", "reward_test.pt", "gen_policy"):
        assert (final / name).exists()
    config = json.loads((helpers.log_dir(run) / "config.json").read_text())
    assert config["algorithm_kwargs"]["demo_minibatch_size"] == 3
    helpers.assert_finite_losses(helpers.progress(run), "disc/disc_loss")


def ex_class(algorithm):
    return {"airl": imitation_accum.AIRL, "gail": imitation_accum.GAIL}[algorithm]


# Every game's named config with one algorithm (alternating), Pong's with both.
# The games' configs differ only in the environment: by default Pong runs (and
# unwrapped Pong, below); the other games with `-m expensive`.
GAMES = sorted(presets.GAMES)
ATARI = [
    *[
        pytest.param(
            name,
            "imitation_accum",
            (84, 84, 4),
            {},
            algorithm,
            marks=() if name == "atari_pong" else pytest.mark.expensive,
        )
        for i, name in enumerate(GAMES)
        for algorithm in (
            ("airl", "gail") if name == "atari_pong" else (("airl", "gail")[i % 2],)
        )
    ],
    # Raw frames make imitation's default CNNs slow on a CPU: narrower ones here.
    *[
        (
            "atari_pong_unwrapped",
            "seals",
            (210, 160, 3),
            {
                "algorithm_specific": {
                    "airl": {
                        "net_kwargs": {
                            "reward_hid_channels": (4,),
                            "potential_hid_channels": (4,),
                        },
                    },
                    "gail": {"net_kwargs": {"hid_channels": (4,)}},
                },
            },
            algorithm,
        )
        for algorithm in ("airl", "gail")
    ],
]


@pytest.mark.parametrize(
    ("named_config", "namespace", "frame_shape", "reward", "algorithm"),
    ATARI,
)
def test_atari_named_config(
    tmp_path,
    named_config,
    namespace,
    frame_shape,
    reward,
    algorithm,
    disc_steps,
):
    game = presets.GAMES.get(named_config, "Pong")
    gym_id = f"{namespace}/{game}NoFrameskip-v4"
    run = helpers.run(
        ex,
        tmp_path,
        [named_config, "fast"],
        {"demonstrations": local_demos(tmp_path, gym_id), "reward": reward},
        command_name=algorithm,
    )
    assert run.config["environment"]["gym_id"] == gym_id
    assert disc_steps
    helpers.assert_finite_losses(helpers.progress(run), "disc/disc_loss")
    final = helpers.log_dir(run) / "checkpoints" / "final"
    # Through the safe loader, as imitation's load_reward reads it on torch >= 2.6.
    nets = [checkpoint.load_reward_net(final / "reward_train.pt")]
    while hasattr(nets[-1], "base"):  # normalization and logit wrappers
        nets.append(nets[-1].base)
    expected = CnnShapedRewardNet if algorithm == "airl" else reward_nets.CnnRewardNet
    assert any(isinstance(net, expected) for net in nets), nets
    assert nets[0].observation_space.shape == frame_shape


def test_print_config_of_atari_pong_needs_no_demonstrations(capsys, tmp_path):
    # atari_pong leaves demonstrations.path unset: showing the config is fine,
    # training is not.
    run = ex.run("print_config", named_configs=["atari_pong"])
    assert run.status == "COMPLETED"
    assert "demonstrations" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"needs demonstrations\.path"):
        ex.run("airl", named_configs=["atari_pong", "fast"])


def test_making_demonstrations_shows_progress(tmp_path, capsys):
    demonstrations.make_demonstrations(
        tmp_path / "demos",
        gym_id="seals/CartPole-v0",
        n_episodes=2,
        max_episode_steps=5,
    )
    bar = capsys.readouterr().err
    assert "Demonstrations" in bar and "2/2" in bar and "steps" in bar
    demonstrations.make_demonstrations(
        tmp_path / "quiet",
        gym_id="seals/CartPole-v0",
        n_episodes=2,
        max_episode_steps=5,
        progress_bar=False,
    )
    assert "Demonstrations" not in capsys.readouterr().err
