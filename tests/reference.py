"""Independent full-batch references, written plainly.

Nothing here uses imitation_accum: these are the definitions the package must
reproduce, computed the slow, obvious way.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data.types import TrajectoryWithRew
from torch import nn

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT_SPACE = gym.spaces.Discrete(3)

Pair = Tuple[TrajectoryWithRew, TrajectoryWithRew]


def make_fragment(
    rng: np.random.Generator,
    length: int,
    *,
    terminal: bool = False,
    obs_space: gym.spaces.Box = OBS_SPACE,
    n_actions: int = 3,
) -> TrajectoryWithRew:
    if obs_space.dtype == np.uint8:
        obs = rng.integers(0, 256, size=(length + 1, *obs_space.shape), dtype=np.uint8)
    else:
        obs = (rng.normal(size=(length + 1, *obs_space.shape)) * 2 + 0.5).astype(
            np.float32,
        )
    return TrajectoryWithRew(
        obs=obs,
        acts=rng.integers(0, n_actions, size=length),
        infos=None,
        terminal=terminal,
        rews=rng.normal(size=length).astype(np.float32),
    )


def make_dataset(
    rng: np.random.Generator,
    n_pairs: int,
    lengths: Sequence[int] = (5,),
    *,
    binary: bool = False,
    **fragment_kwargs,
) -> pc.PreferenceDataset:
    """Pairs whose fragment lengths cycle through ``lengths``."""
    pairs = []
    k = 0
    for _ in range(n_pairs):
        a = make_fragment(rng, lengths[k % len(lengths)], **fragment_kwargs)
        b = make_fragment(rng, lengths[(k + 1) % len(lengths)], **fragment_kwargs)
        k += 2
        pairs.append((a, b))
    if binary:
        prefs = rng.integers(0, 2, size=n_pairs).astype(np.float32)
    else:
        prefs = rng.uniform(size=n_pairs).astype(np.float32)
    dataset = pc.PreferenceDataset()
    dataset.push(pairs, prefs)
    return dataset


def batch_of(dataset: pc.PreferenceDataset, indices) -> Tuple[List[Pair], np.ndarray]:
    pairs = [(dataset.fragments1[i], dataset.fragments2[i]) for i in indices]
    return pairs, np.asarray(dataset.preferences[indices], dtype=np.float32)


def full_batch_loss(
    net: nn.Module,
    pairs: Sequence[Pair],
    preferences: np.ndarray,
    *,
    discount: float = 1.0,
    noise_prob: float = 0.0,
    threshold: float = 50.0,
) -> th.Tensor:
    """Mean cross-entropy of one training-mode forward over the whole batch."""
    frags = [f for pair in pairs for f in pair]
    obs = np.concatenate([f.obs[:-1] for f in frags])
    next_obs = np.concatenate([f.obs[1:] for f in frags])
    acts = np.concatenate([f.acts for f in frags])
    dones = np.concatenate(
        [np.eye(1, len(f.acts), len(f.acts) - 1)[0] * f.terminal for f in frags],
    ).astype(bool)
    rewards = net(*net.preprocess(obs, acts, next_obs, dones))
    returns = []
    start = 0
    for f in frags:
        n = len(f.acts)
        weights = th.tensor([discount**t for t in range(n)], dtype=th.float32)
        returns.append((rewards[start : start + n] * weights).sum())
        start += n
    losses = []
    for i, pref in enumerate(preferences):
        diff = th.clip(returns[2 * i + 1] - returns[2 * i], -threshold, threshold)
        p = noise_prob * 0.5 + (1 - noise_prob) / (1 + th.exp(diff))
        y = float(pref)
        losses.append(
            -(y * th.log(p).clamp(min=-100) + (1 - y) * th.log(1 - p).clamp(min=-100))
        )
    return th.stack(losses).mean()


def grads_of(
    net: nn.Module,
    loss_fn: Callable[[], th.Tensor],
    params: Optional[List[th.Tensor]] = None,
) -> List[th.Tensor]:
    params = list(net.parameters()) if params is None else params
    loss = loss_fn()
    grads = th.autograd.grad(loss, params, allow_unused=True)
    return [th.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def flat(tensors: Sequence[th.Tensor]) -> th.Tensor:
    return th.cat([t.detach().reshape(-1).double() for t in tensors])


def relative_error(actual: Sequence[th.Tensor], expected: Sequence[th.Tensor]) -> float:
    """||actual - expected|| / ||expected||, both flattened."""
    a, e = flat(actual), flat(expected)
    return float(
        th.linalg.vector_norm(a - e) / th.linalg.vector_norm(e).clamp(min=1e-30)
    )


def param_grads(net: nn.Module) -> List[th.Tensor]:
    return [
        th.zeros_like(p) if p.grad is None else p.grad.clone() for p in net.parameters()
    ]


def buffers(net: nn.Module) -> Dict[str, th.Tensor]:
    return {k: v.clone() for k, v in net.named_buffers()}


def epoch_permutations(seed: int, n: int, epochs: int) -> List[np.ndarray]:
    """The documented batch order: a fresh permutation per epoch."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n) for _ in range(epochs)]
