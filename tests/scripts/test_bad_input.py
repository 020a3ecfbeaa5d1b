"""A bad config is rejected, naming the key or path, before anything is built."""

import pytest
import sacred.utils
import torch as th
from imitation.util import util

from imitation_accum.scripts.train_adversarial import train_adversarial_ex
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex,
)
from imitation_accum.scripts.train_reward_model import train_reward_model_ex
from tests.scripts.helpers import largest_memory_bytes


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


@pytest.mark.parametrize(
    ("minibatch_size", "error"),
    [(0, ValueError), (-3, ValueError), (2.5, TypeError), ("4", TypeError)],
)
def test_invalid_minibatch_size(minibatch_size, error):
    with pytest.raises(error, match=r"reward_trainer_kwargs\.minibatch_size"):
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


@pytest.mark.parametrize("command", ["airl", "gail"])
def test_generated_demonstrations_need_a_count(tmp_path, command):
    # imitation's default source, without demonstrations.source=local: refused
    # before the run directory, not by imitation's ingredient inside the run.
    with pytest.raises(
        ValueError, match=r"needs demonstrations\.n_expert_demos.*local"
    ):
        run_adversarial(command, ["seals_cartpole"])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"demonstrations\.n_expert_demos must be"):
        run_adversarial(
            command, ["seals_cartpole"], demonstrations={"n_expert_demos": 0}
        )


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


# --- command-line values caught in the config hooks (issue 31) -----------------


def _checked_before_anything_ran(tmp_path):
    # The fixture's cwd: nothing written under output/, no run directory.
    assert not (tmp_path / "output").exists()


@pytest.mark.parametrize(
    ("updates", "match"),
    [
        ({"environment.num_vec": 0}, r"environment\.num_vec must be a positive int"),
        ({"query_schedule": "foo"}, r"query_schedule='foo' must be one of"),
        (
            {"transition_oversampling": 0},
            r"transition_oversampling must be a positive finite number, got 0",
        ),
        (
            {"gatherer_kwargs.foo": 1},
            r"gatherer_kwargs\.foo: SyntheticGatherer has no argument 'foo'",
        ),
        (
            {"reward_trainer_kwargs.optimizer_kwargs": {"weight_decay": -1}},
            r"reward_trainer_kwargs\.optimizer_kwargs\.weight_decay=-1 refused by "
            r"AdamW: ValueError: Invalid weight_decay value: -1",
        ),
        ({"held_out_pairs": -1}, r"held_out_pairs must be an int >= 0, got -1"),
        ({"seed": -1}, r"seed must be an int >= 0"),
        (
            {"logging.log_format_strs": ["nope"]},
            r"logging\.log_format_strs: 'nope' is not a log format",
        ),
        (
            {"reward.net_kwargs.foo": 1},
            r"reward\.net_kwargs\.foo: BasicRewardNet has no argument 'foo'",
        ),
        (
            {"reward.normalize_output_layer": "foo"},
            r"reward\.normalize_output_layer='foo' must be None or an imitation norm",
        ),
        (
            {"environment.gym_id": "CartPole-v1", "environment.env_make_kwargs.foo": 1},
            r"environment\.env_make_kwargs\.foo: 'CartPole-v1' .* has no argument",
        ),
        (
            {"rl.rl_kwargs.device": "cuda:99"},
            r"rl\.rl_kwargs\.device='cuda:99': this machine has",
        ),
        (
            {
                "rl.rl_kwargs.device": "cpu",
                "reward_trainer_kwargs.autocast_dtype": "float16",
            },
            r"reward_trainer_kwargs\.autocast_dtype='float16' on cpu: "
            r"autocast_dtype='float16' needs a CUDA device.* "
            r"\(rl\.rl_kwargs\.device='cpu'\)$",
        ),
        (
            {"reward_trainer_kwargs.activation_checkpointing": True},
            r"activation_checkpointing=True: reward\.net_cls=BasicRewardNet has no "
            r"convolutions",
        ),
        (
            {"reward_trainer_kwargs.memory_budget": "100B"},
            r"reward_trainer_kwargs\.memory_budget=100 B is smaller than the .* that "
            r"the reward net's parameters",
        ),
        (
            {
                "rl.rl_kwargs.device": "cpu",
                "reward_trainer_kwargs.memory_budget": "10TiB",
            },
            r"reward_trainer_kwargs\.memory_budget=10\.00 TiB is more than the cpu "
            r"device has",
        ),
    ],
)
def test_preference_comparisons_value_named_in_the_hook(tmp_path, updates, match):
    assert largest_memory_bytes() < 10 * 2**40  # the 10TiB case needs a smaller one
    with pytest.raises(ValueError, match=match):
        run_pc(**updates)
    _checked_before_anything_ran(tmp_path)


@pytest.mark.parametrize(
    ("updates", "match"),
    [
        ({"environment.parallel": "no"}, r"environment\.parallel must be a bool"),
        ({"save_preferences": "false"}, r"save_preferences must be a bool"),
        ({"active_selection": "maybe"}, r"active_selection must be a bool"),
        (
            {"reward_trainer_kwargs.progress_bar": "False"},
            r"reward_trainer_kwargs\.progress_bar must be a bool",
        ),
        ({"gatherer_kwargs.sample": "no"}, r"gatherer_kwargs\.sample must be a bool"),
        ({"held_out_pairs": 2.5}, r"held_out_pairs must be an int >= 0, got 2\.5"),
        ({"held_out_pairs": True}, r"held_out_pairs must be an int >= 0, got True"),
        ({"seed": "abc"}, r"seed must be an int >= 0, got 'abc'"),
        (
            {"reward.net_kwargs.use_state": "false"},
            r"reward\.net_kwargs\.use_state must be a bool",
        ),
        (
            {"reward_trainer_kwargs.optimizer_kwargs": 3},
            r"reward_trainer_kwargs\.optimizer_kwargs must be None or a dict",
        ),
    ],
)
def test_preference_comparisons_wrong_type_named_in_the_hook(tmp_path, updates, match):
    with pytest.raises(TypeError, match=match):
        run_pc(**updates)
    _checked_before_anything_ran(tmp_path)


def test_cnn_net_kwargs_checked_against_build_cnn():
    with pytest.raises(ValueError, match=r"net_kwargs\.strid: .*did you mean stride"):
        run_pc(["atari_pong", "fast"], reward={"net_kwargs": {"strid": 2}})


def test_cuda_named_on_a_machine_without_cuda(monkeypatch):
    monkeypatch.setattr(th.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda': this machine has no CUDA"):
        run_pc(**{"rl.rl_kwargs.device": "cuda"})


def test_atari_env_make_kwargs_followed_to_the_ale_environment():
    with pytest.raises(
        ValueError,
        match=r"env_make_kwargs\.repeat_action_probabilty: .*did you mean "
        r"repeat_action_probability\?",
    ):
        run_pc(
            ["atari_pong", "fast"],
            environment={"env_make_kwargs": {"repeat_action_probabilty": 0.1}},
        )


@pytest.mark.parametrize(
    ("gym_id", "name"),
    [
        ("CartPole-v1", "render_mode"),  # the entry point's
        ("CartPole-v1", "disable_env_checker"),  # gym.make's
        ("imitation_accum/PongNoFrameskip-v4", "repeat_action_probability"),  # ALE's
    ],
)
def test_env_make_kwargs_of_a_known_argument_pass_the_hook(gym_id, name):
    # The config is fine up to building the environment, which the fixture refuses.
    with pytest.raises(AssertionError, match="an environment was built"):
        run_pc(
            **{
                "environment.gym_id": gym_id,
                f"environment.env_make_kwargs.{name}": None,
            }
        )


@pytest.mark.parametrize(
    ("command", "updates", "match"),
    [
        (
            "airl",
            {"algorithm_kwargs.disc_opt_kwargs": {"lr": -1}},
            r"algorithm_kwargs\.disc_opt_kwargs\.lr=-1 refused by Adam: ValueError",
        ),
        (
            "gail",
            {"algorithm_kwargs.disc_opt_kwargs": {"weight_decay": -1}},
            r"disc_opt_kwargs\.weight_decay=-1 refused by Adam",
        ),
        (
            "print_config",
            {"algorithm_kwargs.demo_minibatch_size": 0},
            r"algorithm_kwargs\.demo_minibatch_size must be a positive int",
        ),
        (
            "airl",
            {"reward.net_kwargs.foo": 1},
            r"reward\.net_kwargs\.foo: BasicShapedRewardNet has no argument 'foo'",
        ),
        (
            "airl",
            {"algorithm_kwargs.memory_budget": "100B"},
            r"algorithm_kwargs\.memory_budget=100 B is smaller than",
        ),
        (
            "gail",
            {
                "rl.rl_kwargs.device": "cpu",
                "algorithm_kwargs.memory_budget": "10TiB",
            },
            r"algorithm_kwargs\.memory_budget=10\.00 TiB is more than the cpu device",
        ),
    ],
)
def test_adversarial_value_named_in_the_hook(tmp_path, command, updates, match):
    demos = {"demonstrations.source": "local", "demonstrations.path": str(tmp_path)}
    updates = {"algorithm_kwargs.demo_minibatch_size": None, **demos, **updates}
    with pytest.raises(ValueError, match=match):
        run_adversarial(command, **updates)
    _checked_before_anything_ran(tmp_path)


@pytest.mark.parametrize(
    ("command", "updates", "match"),
    [
        (
            "airl",
            {"algorithm_kwargs.allow_variable_horizon": "false"},
            r"algorithm_kwargs\.allow_variable_horizon must be a bool",
        ),
        (
            "gail",
            {"algorithm_kwargs.disc_opt_cls": "Adam"},
            r"algorithm_kwargs\.disc_opt_cls must be a torch\.optim\.Optimizer "
            r"subclass \(torch\.optim\.Adam, not its name\)",
        ),
        ("gail", {"seed": "abc"}, r"seed must be an int >= 0, got 'abc'"),
    ],
)
def test_adversarial_wrong_type_named_in_the_hook(tmp_path, command, updates, match):
    demos = {"demonstrations.source": "local", "demonstrations.path": str(tmp_path)}
    with pytest.raises(TypeError, match=match):
        run_adversarial(command, **updates, **demos)
    _checked_before_anything_ran(tmp_path)


def test_print_config_only_warns_of_a_budget_beyond_the_device(caplog):
    key = "algorithm_kwargs.memory_budget"
    run_adversarial(
        "print_config",
        **{key: "10TiB", "algorithm_kwargs.demo_minibatch_size": None},
    )
    warned = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(warned) == 2  # as AIRL and as GAIL would get it
    assert "this command does not train" in warned[0]


# --- logging.log_format_strs given as one string (issue 31) --------------------

_EXPERIMENTS = {
    "train_preference_comparisons": (train_preference_comparisons_ex, ["fast"]),
    "airl": (train_adversarial_ex, ["fast"]),
    "train_reward_model": (train_reward_model_ex, ["fast"]),
}


@pytest.mark.parametrize("name", sorted(_EXPERIMENTS))
@pytest.mark.parametrize("value", ["nope", "csv"])
def test_log_format_strs_as_a_string_is_named(tmp_path, capsys, name, value):
    ex, named_configs = _EXPERIMENTS[name]
    command = name if name == "airl" else None
    argv = [name, *([command] if command else []), "with", *named_configs]
    log_dir = tmp_path / "run"
    argv += [f"logging.log_format_strs={value}", f"logging.log_dir={log_dir}"]
    # The command line (sacred passes the string): it prints the error, exits 1.
    with pytest.raises(SystemExit) as exited:
        ex.run_commandline(argv)
    assert exited.value.code == 1
    assert (
        f"ValueError: logging.log_format_strs={value!r} must be a list of formats, "
        "not a string, such as logging.log_format_strs=['csv', 'stdout']"
    ) in capsys.readouterr().err
    assert not log_dir.exists()
    _checked_before_anything_ran(tmp_path)


def test_log_format_strs_as_a_tuple_is_taken_as_a_list():
    # imitation's logging ingredient adds a list to the value: a tuple would fail.
    run = train_preference_comparisons_ex.run(
        "print_config",
        named_configs=["fast"],
        config_updates={"logging.log_format_strs": ("csv", "log")},
    )
    assert run.config["logging"]["log_format_strs"] == ["csv", "log"]


@pytest.mark.parametrize("oversampling", [0.5, 1.5, 2])
def test_fractional_transition_oversampling_passes_the_hook(oversampling):
    # imitation takes a float here (fragments are drawn with replacement); the hook
    # lets it through to building the environment, which the fixture refuses.
    with pytest.raises(AssertionError, match="an environment was built"):
        run_pc(transition_oversampling=oversampling)
