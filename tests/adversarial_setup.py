"""Environments, samples and trainers shared by the AIRL/GAIL tests.

Everything is generated locally: random transitions for the exactness tests, and
rollouts of an untrained PPO policy as "expert" demonstrations for the training
runs (exactness does not need a good expert).
"""

import copy
import os
from typing import Any, Dict, Optional, Tuple, Type

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms.adversarial import common
from imitation.data import rollout, types
from imitation.data.wrappers import RolloutInfoWrapper
from imitation.util import logger as imit_logger
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv
from torch import nn

FRAME_SHAPE = (36, 36, 4)  # the smallest frames SB3's NatureCNN accepts
#: Where the generator policy, and so imitation's reward net, live ("cuda" on a GPU).
DEVICE = os.environ.get("IMITATION_ACCUM_TEST_DEVICE", "cpu")


class TinyFramesEnv(gym.Env):
    """Random uint8 frames (height, width, channels), fixed horizon, 3 actions."""

    observation_space = gym.spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, horizon: int = 8) -> None:
        self.horizon = horizon
        self._t = 0
        self._rng = np.random.default_rng(0)

    def _frame(self) -> np.ndarray:
        return self._rng.integers(0, 256, FRAME_SHAPE, dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action):
        self._t += 1
        reward = float(action == 1)
        return self._frame(), reward, False, self._t >= self.horizon, {}


def make_venv(env_id: str, n_envs: int = 1, seed: int = 0) -> DummyVecEnv:
    """A seeded vectorized env whose episodes carry imitation's rollout info."""

    def make(index: int):
        def thunk() -> gym.Env:
            env = TinyFramesEnv() if env_id == "frames" else gym.make(env_id)
            env.reset(seed=seed + index)
            return RolloutInfoWrapper(env)

        return thunk

    venv = DummyVecEnv([make(i) for i in range(n_envs)])
    venv.seed(seed)
    return venv


def random_samples(
    rng: np.random.Generator,
    n: int,
    venv,
) -> Dict[str, np.ndarray]:
    """``n`` random transitions in ``venv``'s spaces, as a ``train_disc`` mapping."""
    obs_space, act_space = venv.observation_space, venv.action_space

    def observations() -> np.ndarray:
        if obs_space.dtype == np.uint8:
            return rng.integers(0, 256, (n, *obs_space.shape), dtype=np.uint8)
        return (rng.normal(size=(n, *obs_space.shape)) * 2 + 0.5).astype(np.float32)

    if isinstance(act_space, gym.spaces.Discrete):
        acts = rng.integers(0, act_space.n, n)
    else:
        acts = rng.uniform(-1.5, 1.5, (n, *act_space.shape)).astype(np.float32)
    return {
        "obs": observations(),
        "acts": acts,
        "next_obs": observations(),
        "dones": rng.random(n) < 0.2,
        "infos": np.array([{}] * n),
    }


def random_transitions(rng: np.random.Generator, n: int, venv) -> types.Transitions:
    return types.Transitions(**random_samples(rng, n, venv))


def small_ppo(venv, *, seed: int = 0, policy: str = "MlpPolicy", **kwargs) -> PPO:
    kwargs = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, **kwargs}
    if policy == "MlpPolicy":
        kwargs.setdefault("policy_kwargs", {"net_arch": [16]})
    return PPO(policy, venv, seed=seed, device=DEVICE, **kwargs)


def rollout_demonstrations(
    venv,
    policy,
    *,
    min_timesteps: int,
    seed: int = 0,
) -> types.Transitions:
    """Transitions of ``policy`` (untrained is fine) on ``venv``."""
    trajectories = rollout.rollout(
        policy,
        venv,
        rollout.make_sample_until(min_timesteps=min_timesteps),
        rng=np.random.default_rng(seed),
    )
    return rollout.flatten_trajectories(trajectories)


def quiet_logger(folder: Optional[str] = None) -> imit_logger.HierarchicalLogger:
    formats = ["csv"] if folder is not None else []
    return imit_logger.configure(folder, format_strs=formats)


def make_trainer(
    cls: Type[common.AdversarialTrainer],
    reward_net: nn.Module,
    *,
    venv,
    gen_algo,
    demo_batch_size: int,
    lr: float = 0.1,
    copy_net: bool = True,
    **kwargs: Any,
) -> common.AdversarialTrainer:
    """A trainer over random demonstrations, SGD unless told otherwise."""
    kwargs.setdefault("disc_opt_cls", th.optim.SGD)
    kwargs.setdefault("disc_opt_kwargs", {"lr": lr})
    kwargs.setdefault("custom_logger", quiet_logger())
    rng = np.random.default_rng(123)
    valid = isinstance(demo_batch_size, int) and demo_batch_size > 0
    n_demos = max(64, 4 * demo_batch_size) if valid else 64
    return cls(
        demonstrations=random_transitions(rng, n_demos, venv),
        demo_batch_size=demo_batch_size,
        venv=venv,
        gen_algo=gen_algo,
        reward_net=copy.deepcopy(reward_net) if copy_net else reward_net,
        **kwargs,
    )


def flat_params(net: nn.Module) -> th.Tensor:
    return th.cat([p.detach().reshape(-1).double().cpu() for p in net.parameters()])


def flat_grads(net: nn.Module) -> th.Tensor:
    return th.cat(
        [
            (p.grad if p.grad is not None else th.zeros_like(p))
            .reshape(-1)
            .double()
            .cpu()
            for p in net.parameters()
        ],
    )


def update_error(initial: nn.Module, net: nn.Module, reference: nn.Module) -> float:
    """Distance of ``net`` from ``reference``, relative to the reference's update."""
    start, ref = flat_params(initial), flat_params(reference)
    return float((flat_params(net) - ref).norm() / (ref - start).norm())


def buffers(net: nn.Module) -> Dict[str, th.Tensor]:
    return {name: buf.detach().cpu().clone() for name, buf in net.named_buffers()}


def norm_buffers_close(a: nn.Module, b: nn.Module, rtol: float = 1e-5) -> bool:
    ba, bb = buffers(a), buffers(b)
    return ba.keys() == bb.keys() and all(
        th.allclose(ba[k].double(), bb[k].double(), rtol=rtol, atol=1e-6) for k in ba
    )


def sample_sequence(
    rng: np.random.Generator,
    n_steps: int,
    batch: int,
    venv,
) -> list[Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]]:
    """Expert and generator samples for ``n_steps`` discriminator steps."""
    return [
        (random_samples(rng, batch, venv), random_samples(rng, batch, venv))
        for _ in range(n_steps)
    ]
