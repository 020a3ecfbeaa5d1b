"""patch(), unpatch(), patched(): imitation's own code runs this package's trainers."""

import csv
import logging
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest
import stable_baselines3
from gymnasium import spaces
from imitation.algorithms import preference_comparisons as pc
from imitation.algorithms.adversarial import airl, gail
from imitation.data import huggingface_utils, rollout, serialize, wrappers
from imitation.data.types import TrajectoryWithRew
from imitation.rewards import reward_nets
from imitation.scripts.ingredients import reward as reward_ingredient
from imitation.scripts.train_adversarial import train_adversarial_ex
from imitation.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex,
)
from imitation.util import util

import imitation_accum
from imitation_accum.adversarial import trainers as adversarial
from imitation_accum.integrations import demonstrations
from imitation_accum.integrations.patching import is_patched
from imitation_accum.preference import dataset as dataset_module
from tests import reference as ref

TARGETS = [
    (pc, "_make_reward_trainer", imitation_accum.make_reward_trainer),
    (pc, "BasicRewardTrainer", imitation_accum.CrossEntropyRewardTrainer),
    (pc, "EnsembleTrainer", imitation_accum.EnsembleTrainer),
    (airl, "AIRL", imitation_accum.AIRL),
    (gail, "GAIL", imitation_accum.GAIL),
    (
        huggingface_utils,
        "TrajectoryDatasetSequence",
        demonstrations.TrajectoryDatasetSequence,
    ),
]


@pytest.fixture(autouse=True)
def _unpatched():
    assert not is_patched()
    yield
    imitation_accum.unpatch()


def test_patch_swaps_and_unpatch_restores():
    originals = [getattr(module, name) for module, name, _ in TARGETS]
    hooks = list(reward_ingredient.reward_ingredient.config_hooks)
    make_reward_net = reward_ingredient._make_reward_net

    imitation_accum.patch()
    imitation_accum.patch()  # idempotent
    for module, name, replacement in TARGETS:
        assert getattr(module, name) is replacement
    assert reward_ingredient._make_reward_net is not make_reward_net
    assert len(reward_ingredient.reward_ingredient.config_hooks) == len(hooks) + 1

    imitation_accum.unpatch()
    imitation_accum.unpatch()  # a no-op
    for (module, name, _), original in zip(TARGETS, originals):
        assert getattr(module, name) is original
    assert reward_ingredient._make_reward_net is make_reward_net
    assert reward_ingredient.reward_ingredient.config_hooks == hooks


def test_patched_nests_and_restores_on_error():
    with pytest.raises(RuntimeError, match="inside"), imitation_accum.patched():
        with imitation_accum.patched():
            assert is_patched()
        assert is_patched()  # the inner block leaves it patched
        raise RuntimeError("inside")
    assert not is_patched()
    assert pc.BasicRewardTrainer is not imitation_accum.CrossEntropyRewardTrainer


def make_preference_comparisons():
    obs_space = spaces.Box(-1, 1, (3,))
    act_space = spaces.Box(-1, 1, (1,))
    traj = TrajectoryWithRew(
        obs=np.zeros((6, 3), np.float32),
        acts=np.zeros((5, 1), np.float32),
        infos=None,
        terminal=True,
        rews=np.zeros(5, np.float32),
    )
    rng = np.random.default_rng(0)
    return pc.PreferenceComparisons(
        pc.TrajectoryDataset([traj], rng=rng),
        reward_nets.BasicRewardNet(obs_space, act_space),
        num_iterations=1,
        rng=rng,
    )


def test_python_api_default_trainer():
    assert type(make_preference_comparisons().reward_trainer) is pc.BasicRewardTrainer
    with imitation_accum.patched():
        trainer = make_preference_comparisons().reward_trainer
    assert type(trainer) is imitation_accum.CrossEntropyRewardTrainer


def test_reward_ingredient_builds_cnn_reward_nets():
    venv = types.SimpleNamespace(
        observation_space=spaces.Box(0, 255, (84, 84, 4), np.uint8),
        action_space=spaces.Discrete(6),
    )
    kwargs = {"normalize_input_layer": None}
    with pytest.raises(TypeError, match="normalize_input_layer"):
        reward_ingredient._make_reward_net(venv, reward_nets.CnnRewardNet, kwargs, None)
    with imitation_accum.patched():
        net = reward_ingredient._make_reward_net(
            venv,
            reward_nets.CnnRewardNet,
            kwargs,
            None,
        )
    assert isinstance(net, reward_nets.CnnRewardNet)


def progress_keys(log_root: pathlib.Path) -> set:
    (progress,) = log_root.glob("**/log/progress.csv")
    with open(progress) as f:
        return set(next(csv.DictReader(f)))


IMITATION_FAST = ["fast", "environment.fast", "rl.fast", "policy_evaluation.fast"]


def run_imitation_preference_comparisons(log_root, minibatch_size):
    return train_preference_comparisons_ex.run(
        named_configs=IMITATION_FAST,
        config_updates={
            "logging": {"log_root": str(log_root), "log_format_strs": ["csv"]},
            "reward_trainer_kwargs": {
                "batch_size": 4,
                "minibatch_size": minibatch_size,
            },
        },
    )


def test_imitation_preference_experiment_under_patched(tmp_path):
    # imitation's own trainer rejects a minibatch size that does not divide the
    # batch, and logs no chunk count ...
    with pytest.raises(ValueError, match="multiple of minibatch size"):
        run_imitation_preference_comparisons(tmp_path / "rejected", 3)
    run_imitation_preference_comparisons(tmp_path / "imitation", 2)
    chunks_key = "reward/final/train/chunks_per_step"
    assert chunks_key not in progress_keys(tmp_path / "imitation")
    # ... this package's trainer, patched into imitation's experiment, takes it.
    with imitation_accum.patched():
        run = run_imitation_preference_comparisons(tmp_path / "accum", 3)
    assert run.status == "COMPLETED"
    assert chunks_key in progress_keys(tmp_path / "accum")


def test_imitation_adversarial_experiment_under_patched(tmp_path, monkeypatch):
    demos = tmp_path / "demos"
    demonstrations.make_demonstrations(
        demos,
        gym_id="seals/CartPole-v0",
        n_episodes=2,
        max_episode_steps=5,
    )
    steps = []
    train_disc = adversarial.AccumulatingAdversarialTrainer.train_disc

    def counting(self, **kwargs):
        steps.append(self.demo_minibatch_size)
        return train_disc(self, **kwargs)

    monkeypatch.setattr(
        adversarial.AccumulatingAdversarialTrainer, "train_disc", counting
    )

    def run():
        return train_adversarial_ex.run(
            "gail",
            named_configs=IMITATION_FAST,
            config_updates={
                "logging": {"log_root": str(tmp_path), "log_format_strs": ["csv"]},
                "demonstrations": {"source": "local", "path": str(demos)},
                "algorithm_kwargs": {"demo_batch_size": 4, "demo_minibatch_size": 3},
            },
        )

    with pytest.raises(ValueError, match="multiple of minibatch size"):
        run()  # imitation's GAIL
    assert not steps
    with imitation_accum.patched():
        assert run().status == "COMPLETED"
    assert steps and set(steps) == {3}


def _sample(trajectories, seed):
    dataset = pc.TrajectoryDataset(trajectories, rng=np.random.default_rng(seed))
    return dataset.sample(60)


def _assert_same_trajectories(first, second):
    # imitation's tests/algorithms/test_preference_comparisons.py::_check_trajs_equal
    assert len(first) == len(second)
    for one, other in zip(first, second):
        np.testing.assert_array_equal(one.obs, other.obs)
        np.testing.assert_array_equal(one.acts, other.acts)
        np.testing.assert_array_equal(one.rews, other.rews)
        assert one.infos is not None and other.infos is not None
        assert list(one.infos) == list(other.infos)
        assert one.terminal == other.terminal


def test_trajectory_dataset_seeding_from_a_warm_cache_as_upstream(tmp_path):
    # imitation's test_trajectory_dataset_seeding: its fixture loads expert
    # trajectories that imitation's lazy_generate_expert_trajectories cached.
    # (Generated on a cold cache they have no infos, upstream as patched: the
    # imitation_tests experiment warms the cache before its runs.)
    path = tmp_path / "experts"
    rng = np.random.default_rng(0)
    venv = util.make_vec_env(
        "seals/CartPole-v0",
        rng=rng,
        n_envs=1,
        max_episode_steps=8,
        post_wrappers=[lambda env, _: wrappers.RolloutInfoWrapper(env)],
    )
    try:
        generated = rollout.rollout(
            None, venv, rollout.make_sample_until(min_episodes=20), rng=rng
        )
    finally:
        venv.close()
    assert all(traj.infos is None for traj in generated)
    serialize.save(path, generated)
    upstream = serialize.load_with_rewards(path)
    with imitation_accum.patched():
        loaded = serialize.load_with_rewards(path)
        assert isinstance(loaded, demonstrations.TrajectoryDatasetSequence)
        patched_sample = _sample(loaded, 0)
        _assert_same_trajectories(patched_sample, _sample(loaded, 0))
        with pytest.raises(AssertionError):
            _assert_same_trajectories(patched_sample, _sample(loaded, 42))
    _assert_same_trajectories(patched_sample, _sample(upstream, 0))


@pytest.mark.parametrize("command", ["airl", "gail"])
def test_imitation_adversarial_experiment_with_sac_under_patched(tmp_path, command):
    # imitation's test_train_adversarial_sac: an off-policy generator trains
    # num_envs steps a round, so total_timesteps=10 makes rounds.
    demos = tmp_path / "demos"
    demonstrations.make_demonstrations(
        demos, gym_id="Pendulum-v1", n_episodes=1, max_episode_steps=8
    )
    with imitation_accum.patched():
        run = train_adversarial_ex.run(
            command,
            named_configs=["pendulum", *IMITATION_FAST, "rl.sac", "policy.sac"],
            config_updates={
                "logging": {"log_root": str(tmp_path), "log_format_strs": []},
                "demonstrations": {"source": "local", "path": str(demos)},
            },
        )
    assert run.config["rl"]["rl_cls"] is stable_baselines3.SAC
    assert run.status == "COMPLETED"
    assert run.result["imit_stats"]["n_traj"] > 0


# --- no process-wide side effects --------------------------------------------

_SIDE_EFFECTS = """
import sys
import torch
before = len(torch.serialization.get_safe_globals())
import imitation_accum
from imitation_accum import checkpoint
assert len(torch.serialization.get_safe_globals()) == before, "allow-list widened"
imitation_accum.patch()
assert "imitation_accum.scripts" not in sys.modules, "patch imported the scripts"
imitation_accum.unpatch()
print(before)
"""


def test_import_and_patch_leave_the_process_alone():
    done = subprocess.run(
        [sys.executable, "-c", _SIDE_EFFECTS],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) < 20  # torch's own few, not the reward-net classes


def test_presets_write_nothing_into_the_working_directory(tmp_path, monkeypatch):
    from imitation_accum.scripts import presets

    monkeypatch.chdir(tmp_path)
    assert presets.render(presets.PRESETS["pong_16gb"]).startswith("{")
    assert list(tmp_path.iterdir()) == []


def saved_store(path: pathlib.Path) -> pathlib.Path:
    """A frame store of 3 pairs, as save_preferences writes one while patched."""
    original = ref.make_dataset(np.random.default_rng(0), 3)
    store = imitation_accum.PreferenceDataset()
    pairs = list(zip(original.fragments1, original.fragments2))
    store.push(pairs, np.asarray(original.preferences, dtype=np.float32))
    store.save(path)
    return path


def test_imitation_load_reads_a_store_while_patched(tmp_path):
    store = saved_store(tmp_path / "preferences.pkl")
    imitation_class = pc.PreferenceDataset  # imported before patching
    with pytest.raises(IsADirectoryError):
        imitation_class.load(store)
    with imitation_accum.patched():
        for load in (imitation_class.load, pc.PreferenceDataset.load):
            loaded = load(store)
            assert isinstance(loaded, imitation_accum.PreferenceDataset)
            assert len(loaded) == 3
    with pytest.raises(IsADirectoryError):  # unpatched: imitation's own again
        imitation_class.load(store)


def test_imitation_load_still_reads_its_pickles_while_patched(tmp_path):
    path = tmp_path / "imitation.pkl"
    ref.make_dataset(np.random.default_rng(0), 2).save(path)
    imitation_class = pc.PreferenceDataset  # imported before patching
    with imitation_accum.patched():
        loaded = imitation_class.load(path)
    assert type(loaded) is imitation_class
    assert len(loaded) == 2


def test_pickle_loader_says_how_to_load_a_store(tmp_path):
    store = saved_store(tmp_path / "preferences.pkl")
    with pytest.raises(ValueError, match=r"is a directory.*PreferenceDataset\.load"):
        dataset_module.read_imitation_pickle(store, str(store))


def test_kwargs_entry_warnings_are_dropped_only_while_patched():
    message = 'Added new config entry: "rl_kwargs.n_epochs"'
    record = logging.LogRecord("rl", logging.WARNING, "", 0, message, (), None)
    rl_logger = logging.getLogger("rl")
    with imitation_accum.patched():
        assert not rl_logger.filter(record)
    assert rl_logger.filter(record)
