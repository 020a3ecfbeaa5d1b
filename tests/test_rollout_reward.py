"""The learned reward batched per rollout equals imitation's per-step path."""

import importlib
import logging
import os
import pathlib
import re
import subprocess
import sys
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Tuple

import gymnasium as gym
import numpy as np
import pytest
import seals  # noqa: F401  (registers seals/CartPole-v0)
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import wrappers
from imitation.rewards import reward_nets, reward_wrapper
from imitation.util import networks
from stable_baselines3 import DQN, PPO
from stable_baselines3.common import vec_env

import imitation_accum
from imitation_accum.integrations import rollout_reward

N_ENVS = 2
N_STEPS = 32  # a rollout; episodes are cut at 10 or 13 steps (TimeLimit.truncated)


class FakePong(gym.Env):
    """uint8 frames (36x36x4, frame-stacked like Atari), 6 actions, random ends."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 4), np.uint8)
    action_space = gym.spaces.Discrete(6)

    def reset(self, *, seed: Any = None, options: Any = None) -> Tuple[Any, Dict]:
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action: Any) -> Tuple[Any, float, bool, bool, Dict]:
        terminated = bool(self.np_random.random() < 0.05)
        return self._frame(), float(action == 1), terminated, False, {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, (36, 36, 4), dtype=np.uint8)


def _cartpole_venv() -> vec_env.VecEnv:
    return vec_env.DummyVecEnv(
        [
            lambda: gym.make("seals/CartPole-v0", max_episode_steps=10),
            lambda: gym.make("seals/CartPole-v0", max_episode_steps=13),
        ]
    )


def _pong_venv() -> vec_env.VecEnv:
    return vec_env.DummyVecEnv(
        [lambda: gym.wrappers.TimeLimit(FakePong(), max_episode_steps=12)] * N_ENVS
    )


def _reward_net(venv: vec_env.VecEnv, normalized: bool) -> reward_nets.RewardNet:
    if (
        isinstance(venv.observation_space, gym.spaces.Box)
        and len(venv.observation_space.shape) == 3
    ):
        net: reward_nets.RewardNet = reward_nets.CnnRewardNet(
            venv.observation_space, venv.action_space, use_next_state=True
        )
    else:
        net = reward_nets.BasicRewardNet(
            venv.observation_space, venv.action_space, use_next_state=True
        )
    if normalized:
        net = reward_nets.NormalizedRewardNet(net, networks.RunningNorm)
    return net


class Spy:
    """Counts reward-net calls and keeps the rewards they return."""

    def __init__(self, fn: Callable[..., np.ndarray]) -> None:
        self.fn = fn
        self.calls = 0
        self.rewards: List[np.ndarray] = []

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        self.calls += 1
        rews = self.fn(*args, **kwargs)
        self.rewards.append(np.array(rews))  # SB3 adds to the array in place
        return rews


def _collect(
    make_venv: Callable[[], vec_env.VecEnv],
    normalized: bool,
    batched: bool,
    rollouts: int = 2,
) -> Dict[str, Any]:
    """Rollouts of a PPO agent from fixed seeds; the buffer after the last."""
    th.manual_seed(0)
    venv = make_venv()
    venv.seed(0)
    net = _reward_net(venv, normalized)
    spy = Spy(net.predict_processed)
    if batched:
        wrapper: reward_wrapper.RewardVecEnvWrapper = (
            rollout_reward.RewardVecEnvWrapper(venv, net.predict_processed)
        )
    else:  # imitation's own wrapper, seeing the learned reward through a spy
        wrapper = reward_wrapper.RewardVecEnvWrapper(venv, spy)
    algo = PPO("MlpPolicy", wrapper, n_steps=N_STEPS, batch_size=16, n_epochs=1, seed=0)
    callback = wrapper.make_log_callback()
    _, callback = algo._setup_learn(N_STEPS * N_ENVS * rollouts, callback)
    callback.on_training_start(locals(), globals())
    buffers = []
    for _ in range(rollouts):
        assert algo.collect_rollouts(
            algo.get_env(), callback, algo.rollout_buffer, n_rollout_steps=N_STEPS
        )
        buf = algo.rollout_buffer
        buffers.append(
            {
                "rewards": buf.rewards.copy(),
                "advantages": buf.advantages.copy(),
                "returns": buf.returns.copy(),
                "episode_starts": buf.episode_starts.copy(),
            }
        )
    callback.on_training_end()
    return {
        "buffers": buffers,
        "episode_rewards": list(wrapper.episode_rewards),
        "norm": [b.clone() for b in net.buffers()],
        "learned": spy.rewards,
        "calls": spy.calls,
    }


def _assert_close(actual: np.ndarray, expected: np.ndarray, scale: float = 0.0) -> None:
    # Float round-off, relative to the rewards' scale.
    scale = max(1.0, scale, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("normalized", [False, True], ids=["plain", "normalized"])
@pytest.mark.parametrize(
    "make_venv", [_cartpole_venv, _pong_venv], ids=["cartpole", "pong_frames"]
)
def test_batched_rollout_equals_per_step(
    make_venv: Callable[[], vec_env.VecEnv], normalized: bool
) -> None:
    per_step = _collect(make_venv, normalized, batched=False)
    batched = _collect(make_venv, normalized, batched=True)
    for ours, reference in zip(batched["buffers"], per_step["buffers"]):
        np.testing.assert_array_equal(
            ours["episode_starts"], reference["episode_starts"]
        )
        for key in ("rewards", "advantages", "returns"):
            _assert_close(ours[key], reference[key])
    _assert_close(
        np.array(batched["episode_rewards"]), np.array(per_step["episode_rewards"])
    )
    assert len(per_step["episode_rewards"]) >= 4
    for ours, reference in zip(batched["norm"], per_step["norm"]):
        _assert_close(ours.numpy(), reference.numpy())
    if normalized:  # the statistics moved: one update per step, as in imitation
        assert float(batched["norm"][-1]) == N_STEPS * N_ENVS * 2


def test_timeout_bootstrap_is_kept() -> None:
    # SB3 adds gamma * V(terminal) to a truncated step's reward before the buffer
    # stores it; the batched path adds the learned reward to that.
    per_step = _collect(_cartpole_venv, normalized=True, batched=False, rollouts=1)
    batched = _collect(_cartpole_venv, normalized=True, batched=True, rollouts=1)
    learned = np.stack(per_step["learned"])  # (steps, envs)
    bootstrap = per_step["buffers"][0]["rewards"] - learned
    assert np.count_nonzero(np.abs(bootstrap) > 1e-3) >= 4  # truncations happened
    _assert_close(
        batched["buffers"][0]["rewards"] - learned,
        bootstrap,
        scale=float(np.abs(learned).max()),
    )


def test_naive_overwrite_loses_the_bootstrap() -> None:
    # Overwriting the buffer's rewards with the learned ones (instead of adding)
    # fails the comparison above: the test can tell.
    per_step = _collect(_cartpole_venv, normalized=False, batched=False, rollouts=1)
    learned = np.stack(per_step["learned"])
    with pytest.raises(AssertionError):
        _assert_close(learned, per_step["buffers"][0]["rewards"])


def test_call_size() -> None:
    venv = _cartpole_venv()
    net = _reward_net(venv, normalized=True)
    forwards = _count_forwards(net.base)
    wrapper = rollout_reward.RewardVecEnvWrapper(
        venv, net.predict_processed, call_size=20
    )
    algo = PPO("MlpPolicy", wrapper, n_steps=N_STEPS, batch_size=16, n_epochs=1, seed=0)
    algo.learn(N_STEPS * N_ENVS, callback=wrapper.make_log_callback())
    assert forwards == [20, 20, 20, 4]  # whole steps of 2 envs, 20 a call


def test_default_call_size_follows_the_net() -> None:
    # On a CPU a call holds what one training call of the net would (the memory
    # probe's rule): the MLP's whole rollout at once, the CNN's frames in smaller
    # calls. The probe's own small calls come first.
    found = {}
    for name, make_venv in (("mlp", _cartpole_venv), ("cnn", _pong_venv)):
        venv = make_venv()
        net = _reward_net(venv, normalized=True)
        forwards = _count_forwards(net.base)
        wrapper = rollout_reward.RewardVecEnvWrapper(venv, net.predict_processed)
        assert wrapper.call_size is None
        algo = PPO("MlpPolicy", wrapper, n_steps=N_STEPS, batch_size=16, n_epochs=1)
        algo.learn(N_STEPS * N_ENVS, callback=wrapper.make_log_callback())
        found[name] = wrapper.call_size
        per_call = max(1, wrapper.call_size // N_ENVS) * N_ENVS
        rollout = N_STEPS * N_ENVS
        calls = [min(per_call, rollout - s) for s in range(0, rollout, per_call)]
        assert forwards[:2] == [2, 4]  # the probe
        assert forwards[2:] == calls
    assert found["mlp"] >= N_STEPS * N_ENVS
    assert 1 <= found["cnn"] < min(found["mlp"], rollout_reward.CALL_SIZE)


def _count_forwards(net: th.nn.Module) -> List[int]:
    sizes: List[int] = []
    net.register_forward_hook(lambda _m, inputs, _o: sizes.append(len(inputs[0])))
    return sizes


def test_off_policy_and_reward_reading_wrappers_keep_per_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    venv = _cartpole_venv()
    net = _reward_net(venv, normalized=False)
    forwards = _count_forwards(net)
    wrapper = rollout_reward.RewardVecEnvWrapper(venv, net.predict_processed)
    with caplog.at_level(logging.INFO, logger=rollout_reward.__name__):
        dqn = DQN("MlpPolicy", wrapper, learning_starts=1000, seed=0)
        dqn.learn(20, callback=wrapper.make_log_callback())
    assert forwards == [N_ENVS] * (dqn.num_timesteps // N_ENVS)  # each step at once
    assert "per environment step (DQN is off-policy" in caplog.text

    venv = _cartpole_venv()
    wrapper = rollout_reward.RewardVecEnvWrapper(venv, net.predict_processed)
    normalized = vec_env.VecNormalize(wrapper, norm_obs=False, norm_reward=True)
    algo = PPO(
        "MlpPolicy", normalized, n_steps=N_STEPS, batch_size=16, n_epochs=1, seed=0
    )
    forwards.clear()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=rollout_reward.__name__):
        algo.learn(N_STEPS * N_ENVS, callback=wrapper.make_log_callback())
    assert forwards == [N_ENVS] * N_STEPS
    assert "VecNormalize between the agent" in caplog.text


def test_switch_off_is_imitations_path(caplog: pytest.LogCaptureFixture) -> None:
    venv = _cartpole_venv()
    net = _reward_net(venv, normalized=False)
    forwards = _count_forwards(net)
    wrapper = rollout_reward.RewardVecEnvWrapper(venv, net.predict_processed)
    wrapper.batched = False  # read when learn() starts
    algo = PPO("MlpPolicy", wrapper, n_steps=N_STEPS, batch_size=16, n_epochs=1, seed=0)
    with caplog.at_level(logging.INFO, logger=rollout_reward.__name__):
        algo.learn(N_STEPS * N_ENVS, callback=wrapper.make_log_callback())
    assert forwards == [N_ENVS] * N_STEPS
    assert "per environment step (batched=False)" in caplog.text
    wrapper.batched = True
    forwards.clear()
    algo.learn(N_STEPS * N_ENVS, callback=wrapper.make_log_callback())
    assert forwards == [2, 4, N_STEPS * N_ENVS]  # the probe, then the whole rollout


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batched": 1}, TypeError, "batched must be a bool"),
        ({"call_size": 0}, ValueError, "call_size must be a positive int"),
        ({"call_size": 2.5}, TypeError, "call_size"),
    ],
)
def test_bad_arguments(kwargs: Dict[str, Any], error: type, match: str) -> None:
    venv = _cartpole_venv()
    net = _reward_net(venv, normalized=False)
    with pytest.raises(error, match=match):
        rollout_reward.RewardVecEnvWrapper(venv, net.predict_processed, **kwargs)


class CallCounter:
    """Counts a module's forward calls and the transitions they see."""

    def __init__(self, module: th.nn.Module) -> None:
        self.calls = 0
        self.transitions = 0
        module.register_forward_hook(self)

    def __call__(self, module: th.nn.Module, args: Any, output: th.Tensor) -> None:
        self.calls += 1
        self.transitions += len(output)


def _agent_trainer(
    cls: type, rng: np.random.Generator, normalized: bool
) -> Tuple[Any, CallCounter]:
    venv = _cartpole_venv()
    net = _reward_net(venv, normalized=normalized)
    raw = net.base if isinstance(net, reward_nets.NormalizedRewardNet) else net
    counter = CallCounter(raw)
    algo = PPO("MlpPolicy", venv, n_steps=N_STEPS, batch_size=16, n_epochs=1, seed=0)
    return cls(algo, net, venv, rng), counter


def _whole_run(patched: bool) -> Dict[str, Any]:
    """Runs imitation's AgentTrainer: train(), sample(), train(), from fixed seeds.

    PPO on seals/CartPole-v0 (2 envs, 500-step episodes), a NormalizedRewardNet
    (RunningNorm) over a BasicRewardNet; each rollout's buffer is captured just
    before PPO trains on it, the normalization buffers after each call.
    """
    th.manual_seed(0)
    venv = vec_env.DummyVecEnv([lambda: gym.make("seals/CartPole-v0")] * N_ENVS)
    venv.seed(0)
    net = reward_nets.NormalizedRewardNet(
        reward_nets.BasicRewardNet(
            venv.observation_space, venv.action_space, use_next_state=True
        ),
        networks.RunningNorm,
    )
    algo = PPO("MlpPolicy", venv, n_steps=64, batch_size=32, n_epochs=1, seed=0)
    rollouts: List[Dict[str, np.ndarray]] = []
    ppo_train = algo.train

    def train_capturing() -> None:
        buf = algo.rollout_buffer
        rollouts.append({"rewards": buf.rewards.copy(), "returns": buf.returns.copy()})
        ppo_train()

    algo.train = train_capturing  # type: ignore[method-assign]
    stats: List[List[np.ndarray]] = []
    context = imitation_accum.patched() if patched else nullcontext()
    with context:
        # imitation's own class, as unmodified imitation code names it.
        trainer = pc.AgentTrainer(algo, net, venv, np.random.default_rng(0))
        trainer.train(128)  # one rollout of 64 steps x 2 envs
        stats.append([b.numpy().copy() for b in net.buffers()])
        fragments = trainer.sample(100)  # an extra 500-step episode per env
        stats.append([b.numpy().copy() for b in net.buffers()])
        trainer.train(256)  # two more rollouts
        stats.append([b.numpy().copy() for b in net.buffers()])
    return {
        "wrapper": type(trainer.reward_venv_wrapper),
        "rollouts": rollouts,
        "stats": stats,
        "fragment_rews": [f.rews for f in fragments],
        "episode_rewards": list(trainer.reward_venv_wrapper.episode_rewards),
    }


def test_whole_run_with_normalization_equals_imitation() -> None:
    # Rewards and RunningNorm statistics through train(), sample(), train(): the
    # patched run against imitation's own classes, up to round-off.
    upstream = _whole_run(patched=False)
    ours = _whole_run(patched=True)
    assert upstream["wrapper"] is reward_wrapper.RewardVecEnvWrapper
    assert ours["wrapper"] is rollout_reward.RewardVecEnvWrapper
    assert len(ours["rollouts"]) == len(upstream["rollouts"]) == 3
    for got, expected in zip(ours["rollouts"], upstream["rollouts"]):
        for key in ("rewards", "returns"):
            _assert_close(got[key], expected[key])
    for got_stats, expected_stats in zip(ours["stats"], upstream["stats"]):
        for got, expected in zip(got_stats, expected_stats):
            _assert_close(got, expected)
    # sample() moved the statistics: its 1,000 extra steps' rewards were seen.
    counts = [float(s[-1]) for s in upstream["stats"]]
    assert counts[1] - counts[0] >= 1000
    assert [float(s[-1]) for s in ours["stats"]] == counts
    for got, expected in zip(ours["fragment_rews"], upstream["fragment_rews"]):
        np.testing.assert_array_equal(got, expected)  # the environment's rewards
    _assert_close(
        np.array(ours["episode_rewards"]), np.array(upstream["episode_rewards"])
    )
    assert len(upstream["episode_rewards"]) >= 2


def test_agent_trainer_sample_skips_a_stateless_net(
    rng: np.random.Generator,
) -> None:
    with imitation_accum.patched():
        trainer, counter = _agent_trainer(pc.AgentTrainer, rng, normalized=False)
    assert isinstance(trainer.reward_venv_wrapper, rollout_reward.RewardVecEnvWrapper)
    trainer.train(N_STEPS * N_ENVS)
    after_train = counter.calls
    assert after_train > 0
    trajectories = trainer.sample(200)  # more than the buffer holds: extra rollouts
    assert sum(len(t) for t in trajectories) >= 200
    assert counter.calls == after_train
    for traj in trajectories:  # the fragments keep the environment's reward
        np.testing.assert_array_equal(traj.rews, np.ones(len(traj)))

    imitations, counter = _agent_trainer(pc.AgentTrainer, rng, normalized=False)
    imitations.train(N_STEPS * N_ENVS)
    after_train = counter.calls
    imitations.sample(200)
    assert counter.calls > after_train  # imitation computes them for nothing


def test_agent_trainer_sample_batches_a_normalized_net(
    rng: np.random.Generator,
) -> None:
    # The statistics see sample()'s steps (see the whole-run test), in few calls.
    seen = {}
    for name, patched in (("imitation", False), ("patched", True)):
        context = imitation_accum.patched() if patched else nullcontext()
        with context:
            trainer, counter = _agent_trainer(pc.AgentTrainer, rng, normalized=True)
            trainer.train(N_STEPS * N_ENVS)
            before = (counter.calls, counter.transitions)
            trainer.sample(200)
        seen[name] = (counter.calls - before[0], counter.transitions - before[1])
    assert seen["patched"][1] == seen["imitation"][1] > 0
    assert seen["patched"][0] < seen["imitation"][0] / 4


def test_patch_installs_and_removes() -> None:
    imitations = reward_wrapper.RewardVecEnvWrapper
    with imitation_accum.patched():
        assert reward_wrapper.RewardVecEnvWrapper is rollout_reward.RewardVecEnvWrapper
        assert pc.AgentTrainer is rollout_reward.AgentTrainer
    assert reward_wrapper.RewardVecEnvWrapper is imitations
    assert pc.AgentTrainer is not rollout_reward.AgentTrainer


def test_wrapping_twice_is_refused() -> None:
    venv = _cartpole_venv()
    net = _reward_net(venv, normalized=False)
    wrapped = reward_wrapper.RewardVecEnvWrapper(venv, net.predict_processed)
    with pytest.raises(ValueError, match="already wrapped"):
        rollout_reward.RewardVecEnvWrapper(wrapped, net.predict_processed)


def test_buffering_wrapper_still_records_env_rewards() -> None:
    venv = wrappers.BufferingWrapper(_cartpole_venv())
    net = _reward_net(venv, normalized=False)
    wrapper = rollout_reward.RewardVecEnvWrapper(venv, net.predict_processed)
    algo = PPO("MlpPolicy", wrapper, n_steps=N_STEPS, batch_size=16, n_epochs=1, seed=0)
    algo.learn(N_STEPS * N_ENVS, callback=wrapper.make_log_callback())
    trajectories, _ = venv.pop_finished_trajectories()
    assert trajectories
    for traj in trajectories:
        np.testing.assert_array_equal(traj.rews, np.ones(len(traj)))


@pytest.mark.parametrize(
    "script", ["train_preference_comparisons", "train_adversarial"]
)
def test_config_key_is_checked_before_training(script: str) -> None:
    module = importlib.import_module(f"imitation_accum.scripts.{script}")
    ex = getattr(module, f"{script}_ex")
    assert ex.run("print_config").config[rollout_reward.CONFIG_KEY] is True
    with pytest.raises(TypeError, match="batched_rollout_reward must be a bool"):
        ex.run("print_config", config_updates={rollout_reward.CONFIG_KEY: "no"})


def test_config_key_sets_the_run_and_unpatch_restores() -> None:
    from imitation_accum.scripts.train_preference_comparisons import (
        train_preference_comparisons_ex as ex,
    )

    seen = []
    ex.pre_run_hooks.append(
        ex.capture(lambda: seen.append(rollout_reward.RewardVecEnvWrapper.batched))
    )
    try:
        ex.run("print_config", config_updates={rollout_reward.CONFIG_KEY: False})
    finally:
        ex.pre_run_hooks.pop()
    assert seen == [False]
    assert rollout_reward.RewardVecEnvWrapper.batched is True


@pytest.mark.expensive
def test_bench_quick(tmp_path: Any) -> None:
    # The experiment's --quick run (about 30 s on two shared cores).
    repo = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            sys.executable,
            "experiments/bench_rollout_reward.py",
            "--quick",
            "--seeds",
            "2",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=repo,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "bench_rollout_reward.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| per step")]
    rows += [line for line in text.splitlines() if line.startswith("| batched")]
    assert len(rows) == 4, text
    assert "Medians over the 2 pairs (each pair's ratio, same seed): whole run" in text
    assert "Across the seeds, per step / batched: final reward accuracy" in text
    assert re.search(
        r"^Made by: `python experiments/bench_rollout_reward\.py --quick", text, re.M
    )
