"""Reward-model training speed and memory: imitation 1.0.1, this package, a floor.

Three implementations train the same reward net on the same preference data:

- ``imitation``: imitation 1.0.1's ``BasicRewardTrainer`` (two reward-net calls
  per pair, one host sync per pair);
- ``accum``: ``imitation_accum.CrossEntropyRewardTrainer`` (``forward_size="auto"``);
- ``floor``: a bare PyTorch loop over pre-stacked tensors (segment sums, BCE,
  accumulate, step), timed at several forward sizes; the fastest is the floor.

Every configuration runs in a fresh process, ``--repeats`` times interleaved with
the others (the fastest run counts); time per epoch is that of one ``train`` call
of several epochs after a warm-up call of one epoch, and memory is
the process's peak RSS minus its RSS before training. Ratios compare runs made in
the same invocation.

Usage::

    python experiments/bench_reward_trainer.py            # all configurations
    python experiments/bench_reward_trainer.py --memory   # memory against sizes
    python experiments/bench_reward_trainer.py --same-process
    python experiments/bench_reward_trainer.py --quick --out-dir /tmp/bench

Tables go to ``--out-dir`` (default ``docs/results/``, the committed ones; with
``--quick``, ``output/experiments/``, which git ignores):
``bench_reward_trainer.md``, ``bench_reward_trainer_memory.md``,
``bench_reward_trainer_same_process.md``. ``--quick`` (with any of the three
modes) checks that the script runs, in seconds: the ``mlp`` configuration alone,
two epochs, one repeat; with ``--memory``, two points (batch 4, minibatch sizes 1
and 2) of 8 pairs of 5-frame fragments, one epoch. Its figures mean little.

``--same-process`` times this trainer and the bare loop in one process, at the
same fixed forward sizes, interleaved, and writes
``bench_reward_trainer_same_process.md``: what the trainer adds to the
loop with the allocator's state and the forward size taken out of the
comparison.

``--memory`` trains ``cnn84`` at batch sizes 4 and 8 and minibatch sizes 1, 2
and 4, with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB so that freed
activations leave the resident set (by default glibc raises the threshold as
blocks are freed and keeps them resident, which hides what a step holds), and
writes ``bench_reward_trainer_memory.md``.
"""

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data.types import TrajectoryWithRew
from imitation.rewards.reward_nets import BasicRewardNet, CnnRewardNet
from imitation.util import logger as imit_logger
from torch.nn import functional as F  # noqa: N812

import _results

CONFIGS = {
    # name: (obs shape, net, pairs, fragment length, batch, minibatch); the CNN
    # configs use imitation's default fragment length, 100.
    "mlp": ((4,), "mlp", 64, 50, 32, 8),
    "cnn84": ((84, 84, 4), "cnn", 8, 100, 4, 2),
    "cnn210": ((210, 160, 3), "cnn", 2, 100, 2, 1),
}
N_ACTIONS = 6
# --quick --memory: pairs and fragment length of its cnn84 points.
QUICK_MEMORY_DATA = {"pairs": 8, "length": 5}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def make_data(shape, n_pairs, length, seed=0):
    rng = np.random.default_rng(seed)
    image = len(shape) == 3

    def frag():
        if image:
            obs = rng.integers(0, 256, size=(length + 1, *shape), dtype=np.uint8)
        else:
            obs = rng.normal(size=(length + 1, *shape)).astype(np.float32)
        return TrajectoryWithRew(
            obs=obs,
            acts=rng.integers(0, N_ACTIONS, size=length),
            infos=None,
            terminal=False,
            rews=rng.normal(size=length).astype(np.float32),
        )

    dataset = pc.PreferenceDataset()
    dataset.push(
        [(frag(), frag()) for _ in range(n_pairs)],
        rng.integers(0, 2, size=n_pairs).astype(np.float32),
    )
    return dataset


def make_net(shape, kind):
    act_space = gym.spaces.Discrete(N_ACTIONS)
    if kind == "mlp":
        obs_space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
        return BasicRewardNet(obs_space, act_space)
    obs_space = gym.spaces.Box(0, 255, shape, np.uint8)
    return CnnRewardNet(obs_space, act_space)


def time_epochs(run_epochs, epochs):
    """Seconds per epoch of one call that trains ``epochs`` epochs.

    A one-epoch call first warms up (and tunes the forward size).
    """
    run_epochs(1)
    start = time.perf_counter()
    run_epochs(epochs)
    return (time.perf_counter() - start) / epochs


def worker(
    impl: str,
    config: str,
    epochs: int,
    minibatch=None,
    batch=None,
    one_pass=False,
    pairs=None,
    length=None,
) -> dict:
    shape, kind, n_pairs, default_length, batch_size, minibatch_size = CONFIGS[config]
    n_pairs = pairs or n_pairs
    length = length or default_length
    batch_size = batch or batch_size
    minibatch_size = minibatch or minibatch_size
    th.manual_seed(0)
    dataset = make_data(shape, n_pairs, length)
    net = make_net(shape, kind)
    logger = imit_logger.configure(format_strs=[])
    extra = {}
    baseline = rss_bytes()
    if impl == "imitation":
        trainer = pc.BasicRewardTrainer(
            pc.PreferenceModel(net),
            pc.CrossEntropyRewardLoss(),
            rng=np.random.default_rng(0),
            batch_size=batch_size,
            minibatch_size=minibatch_size,
            custom_logger=logger,
        )
        seconds = time_epochs(lambda k: train_epochs(trainer, dataset, k), epochs)
    elif impl == "accum":
        # The memory table pins whole-pair chunks (otherwise the planner may
        # time two passes, whose RSS then counts too).
        options = {"two_pass": False} if one_pass else {}
        trainer = accum_trainer(net, batch_size, minibatch_size, **options)
        seconds = time_epochs(lambda k: train_epochs(trainer, dataset, k), epochs)
        extra["forward_size"] = trainer.last_plan.forward_size
        extra["two_pass"] = trainer.last_plan.two_pass
    elif impl == "floor":
        best = None
        for fs in floor_forward_sizes(kind, minibatch_size * 2 * length):
            loop = FloorLoop(net, dataset, batch_size, minibatch_size, fs)
            seconds = time_epochs(loop.epochs, epochs)
            if best is None or seconds < best[0]:
                best = (seconds, fs)
        seconds, extra["forward_size"] = best
    else:
        raise ValueError(impl)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "impl": impl,
        "config": config,
        "batch_size": batch_size,
        "minibatch_size": minibatch_size,
        "pairs": n_pairs,
        "fragment_length": length,
        "seconds_per_epoch": seconds,
        "peak_rss_mib": peak / 2**20,
        "training_memory_mib": (peak - baseline) / 2**20,
        **extra,
    }


def accum_trainer(net, batch_size, minibatch_size, **options):
    """This package's trainer, quiet, with the given extra ``options``."""
    from imitation_accum import CrossEntropyRewardTrainer

    return CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        rng=np.random.default_rng(0),
        batch_size=batch_size,
        minibatch_size=minibatch_size,
        custom_logger=imit_logger.configure(format_strs=[]),
        progress_bar=False,
        **options,
    )


def train_epochs(trainer, dataset, epochs):
    trainer.epochs = epochs
    trainer.train(dataset)


def floor_forward_sizes(kind, chunk_transitions):
    if kind == "mlp":
        return [chunk_transitions]
    sizes = [s for s in (2, 5, 10, 25) if s < chunk_transitions]
    return [*sizes, chunk_transitions]


class FloorLoop:
    """The hand-written loop: tensors stacked once, nothing else."""

    def __init__(self, net, dataset, batch_size, minibatch_size, forward_size):
        self.net = net
        self.batch_size = batch_size
        self.minibatch_size = minibatch_size
        self.forward_size = forward_size
        frags = [
            f for pair in zip(dataset.fragments1, dataset.fragments2) for f in pair
        ]
        self.obs = th.as_tensor(np.stack([f.obs[:-1] for f in frags]))
        self.acts = th.as_tensor(np.stack([f.acts for f in frags]))
        self.prefs = th.as_tensor(dataset.preferences, dtype=th.float32)
        self.optim = th.optim.AdamW(net.parameters(), lr=1e-3)
        self.rng = np.random.default_rng(0)
        self.image = self.obs.dtype == th.uint8

    def rewards(self, obs, acts):
        """One reward-net call."""
        if self.image:
            obs = obs.float() / 255.0  # converted on the device, per call
        onehot = F.one_hot(acts, N_ACTIONS).float()
        return self.net(obs, onehot, obs, th.zeros(len(obs)))

    def epochs(self, k):
        """``k`` epochs."""
        for _ in range(k):
            self.epoch()

    def epoch(self):
        """One epoch: a fresh permutation, batches, minibatches."""
        n = len(self.prefs)
        order = self.rng.permutation(n)
        for b in range(0, n, self.batch_size):
            batch = order[b : b + self.batch_size]
            self.optim.zero_grad()
            for m in range(0, len(batch), self.minibatch_size):
                pairs = th.as_tensor(batch[m : m + self.minibatch_size])
                frag_idx = th.stack([2 * pairs, 2 * pairs + 1], 1).reshape(-1)
                obs = self.obs[frag_idx].flatten(0, 1)
                acts = self.acts[frag_idx].flatten(0, 1)
                rews = th.cat(
                    [
                        self.rewards(
                            obs[s : s + self.forward_size],
                            acts[s : s + self.forward_size],
                        )
                        for s in range(0, len(obs), self.forward_size)
                    ],
                )
                returns = rews.reshape(len(frag_idx), -1).sum(1).reshape(-1, 2)
                probs = th.sigmoid(returns[:, 0] - returns[:, 1])
                loss = F.binary_cross_entropy(probs, self.prefs[pairs], reduction="sum")
                (loss / len(batch)).backward()
            self.optim.step()


def run_worker(impl, config, epochs, env=None, **kwargs) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, config, "--epochs", str(epochs)]
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    out = subprocess.run(
        cmd,
        check=True,
        capture_output=True,
        text=True,
        env=None if env is None else {**os.environ, **env},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "CONFIG"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--minibatch", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--one-pass", action="store_true")
    parser.add_argument("--pairs", type=int, help="worker: pairs in the dataset")
    parser.add_argument("--length", type=int, help="worker: fragment length")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds, to check it runs: mlp only, 2 epochs, 1 repeat",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", nargs="*", choices=list(CONFIGS))
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--same-process", action="store_true")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    _results.resolve_out_dir(args)
    if args.worker:
        result = worker(
            *args.worker,
            args.epochs,
            args.minibatch,
            args.batch,
            args.one_pass,
            args.pairs,
            args.length,
        )
        print(json.dumps(result))
        return
    repeats = 1 if args.quick else args.repeats
    if args.memory:
        memory_table(args.out_dir, epochs=1 if args.quick else 2, quick=args.quick)
        return
    if args.same_process:
        configs = ["mlp"] if args.quick else list(SAME_PROCESS)
        same_process_table(args.out_dir, repeats, configs, quick=args.quick)
        return
    epochs = 2 if args.quick else args.epochs
    configs = args.configs or (["mlp"] if args.quick else list(CONFIGS))
    rows = []
    for config in configs:
        results: dict = {}
        # Interleaved fresh processes; the fastest run of each counts, as other
        # load on a shared machine only ever slows a run down.
        for _ in range(repeats):
            for impl in ("imitation", "accum", "floor"):
                run = run_worker(impl, config, epochs)
                best = results.get(impl)
                if best is None or run["seconds_per_epoch"] < best["seconds_per_epoch"]:
                    results[impl] = run
        rows.append(results)
        print(json.dumps(results), flush=True)
    write_tables(rows, args.out_dir)


def write_tables(rows, out_dir: Path) -> None:
    header = (
        "config",
        "batch / minibatch",
        "imitation 1.0.1 s/epoch",
        "accum s/epoch",
        "floor s/epoch",
        "imitation / accum",
        "accum / floor",
        "accum forward_size",
        "floor forward_size",
        "peak RSS MiB (imitation / accum / floor)",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        i, a, f = r["imitation"], r["accum"], r["floor"]
        lines.append(
            f"| {a['config']} | {a['batch_size']} / {a['minibatch_size']} "
            f"| {i['seconds_per_epoch']:.3f} | {a['seconds_per_epoch']:.3f} "
            f"| {f['seconds_per_epoch']:.3f} "
            f"| {i['seconds_per_epoch'] / a['seconds_per_epoch']:.2f}x "
            f"| {a['seconds_per_epoch'] / f['seconds_per_epoch']:.2f}x "
            f"| {a.get('forward_size')}{' (two-pass)' if a.get('two_pass') else ''} "
            f"| {f.get('forward_size')} "
            f"| {i['peak_rss_mib']:.0f} / {a['peak_rss_mib']:.0f} "
            f"/ {f['peak_rss_mib']:.0f} |",
        )
    write(out_dir / "bench_reward_trainer.md", lines)


def write(path: Path, lines) -> None:
    """Writes the table ``lines`` to ``path``, then the line naming its maker."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_results.with_made_by("\n".join(lines)))
    print("\n".join(lines))
    print(f"wrote {path}")


# config -> (forward sizes, epochs per timed call)
SAME_PROCESS = {"mlp": ((800,), 25), "cnn84": ((2, 4, 5, 8), 2)}


def same_process_table(out_dir: Path, repeats: int, configs, quick=False) -> None:
    """This trainer against the bare loop in one process, same forward sizes."""
    lines = [
        "| config | forward_size | accum s/epoch | floor s/epoch | accum / floor |",
        "|---|---|---|---|---|",
    ]
    for config in configs:
        sizes, epochs = SAME_PROCESS[config]
        epochs = 2 if quick else epochs
        shape, kind, n_pairs, length, batch_size, minibatch_size = CONFIGS[config]
        th.manual_seed(0)
        dataset = make_data(shape, n_pairs, length)
        net = make_net(shape, kind)
        for size in sizes:
            trainer = accum_trainer(
                net,
                batch_size,
                minibatch_size,
                forward_size=size,
                two_pass=False,
            )
            loop = FloorLoop(net, dataset, batch_size, minibatch_size, size)
            run_accum = functools.partial(train_epochs, trainer, dataset)
            accum, floor = [], []
            for _ in range(repeats):  # interleaved; the fastest of each counts
                accum.append(time_epochs(run_accum, epochs))
                floor.append(time_epochs(loop.epochs, epochs))
            lines.append(
                f"| {config} | {size} | {min(accum):.4f} | {min(floor):.4f} "
                f"| {min(accum) / min(floor):.2f}x |",
            )
            print(lines[-1], flush=True)
    write(out_dir / "bench_reward_trainer_same_process.md", lines)


def memory_table(out_dir: Path, epochs: int, quick=False) -> None:
    """Training memory of ``cnn84`` against batch and minibatch size.

    ``quick``: batch 4, minibatch sizes 1 and 2, short fragments.
    """
    env = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    data = QUICK_MEMORY_DATA if quick else {}
    runs = []
    for batch in (4,) if quick else (4, 8):
        for minibatch in (1, 2) if quick else (1, 2, 4):
            runs.append(
                run_worker(
                    "accum",
                    "cnn84",
                    epochs,
                    env=env,
                    batch=batch,
                    minibatch=minibatch,
                    one_pass=True,
                    **data,
                ),
            )
            print(json.dumps(runs[-1]), flush=True)
    lines = [
        "| cnn84: batch / minibatch (one pass) | training memory MiB "
        "(peak RSS - RSS before training) | s/epoch | forward_size |",
        "|---|---|---|---|",
    ]
    for m in runs:
        lines.append(
            f"| {m['batch_size']} / {m['minibatch_size']} "
            f"| {m['training_memory_mib']:.0f} | {m['seconds_per_epoch']:.2f} "
            f"| {m['forward_size']} |",
        )
    write(out_dir / "bench_reward_trainer_memory.md", lines)


if __name__ == "__main__":
    main()
