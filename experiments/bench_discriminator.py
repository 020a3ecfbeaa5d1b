"""Discriminator update speed and memory: ``GAIL.train_disc`` against a bare loop.

Four implementations run the same discriminator update, imitation's
``CnnRewardNet`` (default architecture) on 84x84x4 uint8 frames with 6 actions:

- ``bare``: a bare PyTorch loop over the same chunks, frames stacked once as uint8
  tensors on the device in chunk order; per chunk: convert, forward, BCE with
  logits summed and divided by the batch, backward; then one Adam step;
- ``bare_host``: the same loop with the stacked frames on the host, each chunk
  copied to the device (where imitation's data lives: demonstrations and the
  replay buffer are numpy arrays);
- ``accum_given``: ``imitation_accum.GAIL.train_disc(expert_samples=...,
  gen_samples=...)`` with the same samples every step: the update itself (staging,
  copies, forward/backward, one step, full-batch statistics and logging);
- ``accum``: ``train_disc()`` as ``train()`` calls it, which also draws the expert
  batch through imitation's demonstration ``DataLoader`` and the generator batch
  from imitation's replay buffer.

Every configuration runs in a fresh process. Time per discriminator step is the
median over timed steps after warm-up steps; memory is the peak during the steps:
on CUDA ``torch.cuda.max_memory_allocated``, on CPU the process's peak RSS minus
its RSS just before the first step. Ratios compare runs of the same invocation.
``--check`` also verifies, on the chosen device, that every minibatch size gives
the parameters of the whole-batch update.

Usage::

    python experiments/bench_discriminator.py                  # CPU, batch 64
    python experiments/bench_discriminator.py --device cuda --batch 512 --check
    python experiments/bench_discriminator.py --quick --check --out-dir /tmp/disc

Writes ``bench_discriminator.md`` to ``--out-dir`` (default ``docs/results/``,
the committed table; with ``--quick``, ``output/experiments/``, which git
ignores; ``--out FILE`` to name the file). ``--quick`` checks that the script
runs, in seconds: batch 8, minibatch size 2 (unless ``--minibatches``), one timed
step; its figures mean little.
"""

import argparse
import copy
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import gymnasium as gym
import numpy as np
import torch as th
from imitation.data import types
from imitation.rewards.reward_nets import CnnRewardNet
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv
from torch.nn import functional as F  # noqa: N812

import _results
from _quiet_logger import quiet_logger

FRAME = (84, 84, 4)
N_ACTIONS = 6


class FramesEnv(gym.Env):
    """Random 84x84x4 uint8 frames; only its spaces matter here."""

    observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    action_space = gym.spaces.Discrete(N_ACTIONS)

    def reset(self, *, seed=None, options=None):
        """A random frame."""
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        """A random frame, no reward, never done."""
        return self.observation_space.sample(), 0.0, False, False, {}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def random_transitions(rng: np.random.Generator, n: int) -> types.Transitions:
    return types.Transitions(
        obs=rng.integers(0, 256, (n, *FRAME), dtype=np.uint8),
        acts=rng.integers(0, N_ACTIONS, n),
        next_obs=rng.integers(0, 256, (n, *FRAME), dtype=np.uint8),
        dones=np.zeros(n, dtype=bool),
        infos=np.array([{}] * n),
    )


def make_gail(batch: int, minibatch: int, device: str, net: th.nn.Module, **kwargs):
    from imitation_accum import GAIL

    rng = np.random.default_rng(0)
    venv = DummyVecEnv([FramesEnv])
    # GAIL's discriminator never calls the generator policy: a tiny MLP will do.
    ppo = PPO(
        "MlpPolicy", venv, n_steps=8, policy_kwargs={"net_arch": [8]}, device=device
    )
    trainer = GAIL(
        demonstrations=random_transitions(rng, 2 * batch),
        demo_batch_size=batch,
        demo_minibatch_size=minibatch,
        venv=venv,
        gen_algo=ppo,
        reward_net=net,
        gen_replay_buffer_capacity=2 * batch,
        custom_logger=quiet_logger(),
        **kwargs,
    )
    trainer._gen_replay_buffer.store(random_transitions(rng, 2 * batch))
    return trainer


class BareLoop:
    """The hand-written update: stacked tensors, BCE with logits, accumulate, step.

    Frames are stacked once in chunk order (each chunk's expert rows, then its
    generator rows), on the device or, with ``on_device=False``, on the host, from
    where each chunk is copied to the device as imitation's data would be.
    """

    def __init__(
        self,
        net: th.nn.Module,
        batch: int,
        minibatch: int,
        device: str,
        *,
        on_device: bool = True,
    ):
        rng = np.random.default_rng(0)
        expert, gen = random_transitions(rng, batch), random_transitions(rng, batch)
        self.net = net.to(device)
        self.device = th.device(device)
        self.rows = [
            slice(s, min(s + minibatch, batch)) for s in range(0, batch, minibatch)
        ]
        where = self.device if on_device else th.device("cpu")

        def stacked(a: np.ndarray, b: np.ndarray) -> th.Tensor:
            chunks = [part for r in self.rows for part in (a[r], b[r])]
            return th.as_tensor(np.concatenate(chunks), device=where)

        self.obs = stacked(expert.obs, gen.obs)
        self.acts = stacked(expert.acts, gen.acts)
        self.n_items = 2 * batch
        self.optim = th.optim.Adam(net.parameters())

    def step(self) -> None:
        """One discriminator update over the stacked batch, in minibatches."""
        self.optim.zero_grad()
        offset = 0
        for r in self.rows:
            n = r.stop - r.start
            rows = slice(offset, offset + 2 * n)
            offset += 2 * n
            obs = self.obs[rows].to(self.device).float() / 255.0
            acts = F.one_hot(self.acts[rows].to(self.device), N_ACTIONS).float()
            labels = th.cat(
                [th.ones(n, device=self.device), th.zeros(n, device=self.device)]
            )
            logits = self.net(obs, acts, obs, th.zeros(2 * n, device=self.device))
            loss = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
            (loss / self.n_items).backward()
        self.optim.step()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        th.cuda.synchronize()


def worker(impl: str, batch: int, minibatch: int, device: str, steps: int) -> Dict:
    th.manual_seed(0)
    obs_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    net = CnnRewardNet(obs_space, gym.spaces.Discrete(N_ACTIONS))
    if impl == "accum":
        step = make_gail(batch, minibatch, device, net).train_disc
    elif impl == "accum_given":
        trainer = make_gail(batch, minibatch, device, net)
        rng = np.random.default_rng(0)
        expert, gen = (
            types.dataclass_quick_asdict(random_transitions(rng, batch)) for _ in "eg"
        )

        def step() -> None:
            trainer.train_disc(expert_samples=expert, gen_samples=gen)

    elif impl == "bare":
        step = BareLoop(net, batch, minibatch, device).step
    elif impl == "bare_host":
        step = BareLoop(net, batch, minibatch, device, on_device=False).step
    else:
        raise ValueError(impl)
    step()  # warm-up (allocator, kernels' autotuning)
    synchronize(device)
    baseline = rss_bytes()
    if device.startswith("cuda"):
        th.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    if device.startswith("cuda"):
        memory = th.cuda.max_memory_allocated()
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    return {
        "impl": impl,
        "device": device,
        "batch": batch,
        "minibatch": minibatch,
        "seconds_per_step": statistics.median(times),
        "memory_mib": memory / 2**20,
    }


def flat(net: th.nn.Module) -> th.Tensor:
    return th.cat([p.detach().reshape(-1).double() for p in net.parameters()])


def check_exactness(batch: int, minibatches: List[int], device: str) -> Dict:
    """Largest parameter difference from the whole-batch update, per size.

    On a CPU with oneDNN's convolutions off: they pick their algorithm by batch
    size, and the minibatches' gradients then differ from the whole batch's by
    about 1e-4 (relative) whatever the accumulation does; PyTorch's own agree to
    about 1e-7.
    """
    if device == "cpu":
        with th.backends.mkldnn.flags(enabled=False):
            return _check_exactness(batch, minibatches, device)
    return _check_exactness(batch, minibatches, device)


def _check_exactness(batch: int, minibatches: List[int], device: str) -> Dict:
    th.manual_seed(0)
    obs_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    net = CnnRewardNet(obs_space, gym.spaces.Discrete(N_ACTIONS), hid_channels=(8, 8))
    rng = np.random.default_rng(1)
    samples = [
        [types.dataclass_quick_asdict(random_transitions(rng, batch)) for _ in "eg"]
        for _ in range(2)
    ]
    params = {}
    for minibatch in [batch, *minibatches]:
        trainer = make_gail(
            batch,
            minibatch,
            device,
            copy.deepcopy(net),
            disc_opt_cls=th.optim.SGD,
            disc_opt_kwargs={"lr": 1.0},
        )
        for expert, gen in samples:
            trainer.train_disc(expert_samples=expert, gen_samples=gen)
        params[minibatch] = flat(trainer._reward_net)
    start = flat(net).to(params[batch])
    update = (params[batch] - start).norm()
    return {
        "device": device,
        "batch": batch,
        "relative_difference": {
            m: float((params[m] - params[batch]).norm() / update) for m in minibatches
        },
    }


def run_worker(impl: str, batch: int, minibatch: int, device: str, steps: int) -> Dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        impl,
        "--batch",
        str(batch),
        "--minibatches",
        str(minibatch),
        "--device",
        device,
        "--steps",
        str(steps),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


IMPLS = ("bare", "bare_host", "accum_given", "accum")


def table(rows: List[Dict[str, Dict]]) -> str:
    lines = [
        "| device | batch / minibatch | s/step: bare (device) / bare (host) / "
        "train_disc(samples) / train_disc() | ratio to bare (device): "
        "train_disc(samples) / train_disc() | ratio to bare (host): "
        "train_disc(samples) | memory MiB: bare / train_disc() |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        sec = {impl: row[impl]["seconds_per_step"] for impl in IMPLS}
        bare, accum = row["bare"], row["accum"]
        lines.append(
            f"| {accum['device']} | {accum['batch']} / {accum['minibatch']} "
            f"| {' / '.join(f'{sec[i]:.4f}' for i in IMPLS)} "
            f"| {sec['accum_given'] / sec['bare']:.2f}x / "
            f"{sec['accum'] / sec['bare']:.2f}x "
            f"| {sec['accum_given'] / sec['bare_host']:.2f}x "
            f"| {bare['memory_mib']:.0f} / {accum['memory_mib']:.0f} |",
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=IMPLS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--minibatches", type=int, nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds, to check it runs: batch 8, minibatch 2, 1 step",
    )
    parser.add_argument("--check", action="store_true", help="check exactness too")
    _results.add_out_dir(parser)
    parser.add_argument(
        "--out",
        type=Path,
        help="the table's file (default OUT_DIR/bench_discriminator.md)",
    )
    args = parser.parse_args(argv)
    _results.resolve_out_dir(args)
    if args.worker:
        result = worker(
            args.worker, args.batch, args.minibatches[0], args.device, args.steps
        )
        print(json.dumps(result))
        return
    batch, steps = (8, 1) if args.quick else (args.batch, args.steps)
    default_minibatches = [batch, max(1, batch // 4), max(1, batch // 16)]
    if args.quick:
        default_minibatches = [2]
    minibatches = args.minibatches or default_minibatches
    exactness = None
    if args.check:
        check_batch = min(batch, 16)
        uneven = [m for m in (1, 3, 5) if m < check_batch]
        exactness = check_exactness(check_batch, uneven, args.device)
        print(json.dumps(exactness))
    rows = []
    for minibatch in minibatches:
        row = {
            impl: run_worker(impl, batch, minibatch, args.device, steps)
            for impl in IMPLS
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    text = table(rows)
    if exactness is not None:
        differences = ", ".join(
            f"minibatch {m}: {d:.1e}"
            for m, d in exactness["relative_difference"].items()
        )
        text += (
            f"\n\nExactness (--check), {exactness['device']}, batch "
            f"{exactness['batch']}, SGD, two steps: parameters' relative difference "
            f"from the whole-batch update: {differences}."
        )
    out = args.out or args.out_dir / "bench_discriminator.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_results.with_made_by(text, args.device))
    print(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
