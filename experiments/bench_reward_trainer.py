"""Reward-model training speed and memory: imitation 1.0.1, this package, a floor.

Four implementations train the same reward net on the same preference data:

- ``imitation``: imitation 1.0.1's ``BasicRewardTrainer`` (two reward-net calls
  per pair, one host sync per pair);
- ``accum``: ``imitation_accum.CrossEntropyRewardTrainer`` (the default
  ``forward_size="auto"``, derived from the memory probe);
- ``floor``: a bare PyTorch loop over pre-stacked tensors (segment sums, BCE,
  accumulate, step), a minibatch's fragments interleaved in its calls, timed at
  several forward sizes; the fastest is the floor (quiet: at the faster of one
  intra-op thread and PyTorch's count in a one-epoch trial; busy: one thread);
- ``exact-floor``: the same loop with this package's mirrored calls (each side
  of the pairs end to end, call ``k`` of one side then of the other), which the
  exact zeros under AdamW need (docs/exactness.md).

Every point runs in a fresh process, ``--repeats`` times, the repeats of a
configuration interleaved (every point once per repeat, the order reversed
every other repeat); the table gives medians, and ratios are medians of the
ratios within a repeat. Time per epoch is that of one ``train`` call after a
warm-up call of one epoch (which runs the memory probe). ``--busy`` also
measures every point with a competing PyTorch job running. The bare loops run
with the glibc ``malloc`` settings the trainer's ``reuse_host_memory`` sets.

Usage::

    python experiments/bench_reward_trainer.py            # all configurations
    python experiments/bench_reward_trainer.py --memory   # memory against sizes
    python experiments/bench_reward_trainer.py --same-process
    python experiments/bench_reward_trainer.py --quick --out-dir /tmp/bench
    python experiments/bench_reward_trainer.py --busy --resume run.log  # go on

Tables go to ``--out-dir`` (default ``docs/results/``, the committed ones; with
``--quick``, ``output/experiments/``, which git ignores):
``bench_reward_trainer.md`` (with its rows, ``bench_reward_trainer.json``, and a
plot of each time per epoch over the floor's, ``bench_reward_trainer.png``),
``bench_reward_trainer_memory.md``, ``bench_reward_trainer_same_process.md``.
``--quick`` (with any of the three modes) checks that the script runs, in
seconds: the ``mlp`` configuration alone, two epochs, one repeat; with
``--memory``, two points (batch 4, minibatch sizes 1 and 2) of 8 pairs of
5-frame fragments, one epoch. Its figures mean little.

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
import contextlib
import copy
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
from torch.nn import functional as F  # noqa: N812

import _results
from _quiet_logger import quiet_logger

CONFIGS = {
    # name: (obs shape, net, pairs, fragment length, batch, minibatch). The CNN
    # epochs hold about 800 frames of 84x84 (cnn84-25 is the 16 pairs,
    # batch 16, minibatch 4), a second or two on two cores: short enough that a
    # full run, every point in a fresh process, quiet and busy, fits in about 40
    # minutes.
    "mlp": ((4,), "mlp", 64, 50, 64, 16),
    "cnn84-25": ((84, 84, 4), "cnn", 16, 25, 16, 4),
    "cnn84-100": ((84, 84, 4), "cnn", 4, 100, 4, 1),
    "cnn210": ((210, 160, 3), "cnn", 4, 25, 4, 1),
}
#: Epochs of the timed ``train`` call of each configuration (after a warm-up):
#: an MLP epoch of this package or the bare loops takes milliseconds, which a
#: fresh process times unsteadily; imitation's MLP epochs take 100x longer on a
#: loaded machine than the others (one epoch: IMITATION_EPOCHS).
EPOCHS = {"mlp": 100, "cnn84-25": 1, "cnn84-100": 1, "cnn210": 1}
IMITATION_EPOCHS = {"mlp": 1}
#: The bare loop's call sizes tried on the CNNs (the fastest is the floor).
FLOOR_CNN_SIZES = (2, 4)
#: --busy: the competing job multiplies matrices of this size, with as many
#: intra-op threads as the machine has cores.
COMPETITOR_MATRIX = 384
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

    A one-epoch call first warms up (and runs the memory probe).
    """
    return time_first_and_epochs(run_epochs, epochs)[1]


def time_first_and_epochs(run_epochs, epochs):
    """Seconds of a first one-epoch call, and per epoch of a later call."""
    start = time.perf_counter()
    run_epochs(1)
    first = time.perf_counter() - start
    start = time.perf_counter()
    run_epochs(epochs)
    return first, (time.perf_counter() - start) / epochs


def load_average() -> float:
    """The machine's one-minute load average."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def worker(
    impl: str,
    config: str,
    epochs: int,
    minibatch=None,
    batch=None,
    one_pass=False,
    pairs=None,
    length=None,
    threads=None,
) -> dict:
    shape, kind, n_pairs, default_length, batch_size, minibatch_size = CONFIGS[config]
    n_pairs = pairs or n_pairs
    length = length or default_length
    batch_size = batch or batch_size
    minibatch_size = minibatch or minibatch_size
    if threads:
        th.set_num_threads(threads)
    th.manual_seed(0)
    dataset = make_data(shape, n_pairs, length)
    net = make_net(shape, kind)
    logger = quiet_logger()
    extra = {"load_average": load_average()}
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
        # The memory table pins whole-pair chunks.
        options = {"two_pass": False} if one_pass else {}
        trainer = accum_trainer(net, batch_size, minibatch_size, **options)
        first, seconds = time_first_and_epochs(
            lambda k: train_epochs(trainer, dataset, k), epochs
        )
        extra["first_train_seconds"] = first
        extra["forward_size"] = trainer.last_plan.forward_size
        extra["two_pass"] = trainer.last_plan.two_pass
        # The trainer's thread policy (planning.threads), or the process's count.
        extra["threads"] = trainer.last_plan.threads or th.get_num_threads()
    elif impl in FLOORS:
        best = None
        loop_class = FLOORS[impl]
        sizes = floor_forward_sizes(kind, minibatch_size * 2 * length, impl)
        if threads is None:  # quiet: the faster thread count of a one-epoch trial
            count = floor_threads(
                loop_class, net, dataset, batch_size, minibatch_size, sizes[0]
            )
            th.set_num_threads(count)
        loop_class(net, dataset, batch_size, minibatch_size, sizes[0]).epochs(1)
        extra["threads"] = th.get_num_threads()
        for fs in sizes:  # warmed up once; then each size's epochs timed
            loop = loop_class(net, dataset, batch_size, minibatch_size, fs)
            start = time.perf_counter()
            loop.epochs(epochs)
            seconds = (time.perf_counter() - start) / epochs
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


def floor_threads(loop_class, net, dataset, batch_size, minibatch_size, size) -> int:
    """The faster intra-op thread count of a bare loop's epoch: one or PyTorch's.

    One epoch at each count (one thread first) decides; the parameters it
    updated are put back.
    """
    counts = sorted({1, th.get_num_threads()})
    start = copy.deepcopy(net.state_dict())
    seconds = {}
    for count in counts:
        th.set_num_threads(count)
        loop = loop_class(net, dataset, batch_size, minibatch_size, size)
        begin = time.perf_counter()
        loop.epochs(1)
        seconds[count] = time.perf_counter() - begin
    net.load_state_dict(start)
    return min(counts, key=lambda count: seconds[count])


def accum_trainer(net, batch_size, minibatch_size, **options):
    """This package's trainer, quiet, with the given extra ``options``."""
    from imitation_accum import CrossEntropyRewardTrainer

    return CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        rng=np.random.default_rng(0),
        batch_size=batch_size,
        minibatch_size=minibatch_size,
        custom_logger=quiet_logger(),
        progress_bar=False,
        **options,
    )


def train_epochs(trainer, dataset, epochs):
    trainer.epochs = epochs
    trainer.train(dataset)


def floor_forward_sizes(kind, chunk_transitions, impl="floor"):
    if kind == "mlp":  # one call per minibatch; per side for the exact floor
        return [chunk_transitions // (2 if impl == "exact-floor" else 1)]
    return [s for s in FLOOR_CNN_SIZES if s <= chunk_transitions]


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
                returns_a, returns_b = self.returns(pairs)
                probs = th.sigmoid(returns_a - returns_b)
                loss = F.binary_cross_entropy(probs, self.prefs[pairs], reduction="sum")
                (loss / len(batch)).backward()
            self.optim.step()

    def returns(self, pairs):
        """Both fragments' returns: the pairs' fragments interleaved in calls."""
        frag_idx = th.stack([2 * pairs, 2 * pairs + 1], 1).reshape(-1)
        obs = self.obs[frag_idx].flatten(0, 1)
        acts = self.acts[frag_idx].flatten(0, 1)
        size = self.forward_size
        rews = th.cat(
            [
                self.rewards(obs[s : s + size], acts[s : s + size])
                for s in range(0, len(obs), size)
            ],
        )
        returns = rews.reshape(len(frag_idx), -1).sum(1).reshape(-1, 2)
        return returns[:, 0], returns[:, 1]


class ExactFloorLoop(FloorLoop):
    """The hand-written loop with this package's exact zeros.

    The first fragments of a minibatch's pairs are laid end to end, and so are
    the second ones; call ``k`` of the first side, then call ``k`` of the second,
    so that the two sides' contributions to a constant shift of the reward cancel
    bit for bit (docs/exactness.md). The interleaved calls of :class:`FloorLoop`
    leave round-off there.
    """

    def returns(self, pairs):
        """Both fragments' returns: each side end to end, calls mirrored."""
        sides = [
            (self.obs[idx].flatten(0, 1), self.acts[idx].flatten(0, 1))
            for idx in (2 * pairs, 2 * pairs + 1)
        ]
        size, calls = self.forward_size, ([], [])
        for s in range(0, len(sides[0][0]), size):
            for k, (obs, acts) in enumerate(sides):
                calls[k].append(self.rewards(obs[s : s + size], acts[s : s + size]))
        return tuple(th.cat(c).reshape(len(pairs), -1).sum(1) for c in calls)


class FiguresLoop(ExactFloorLoop):
    """The exact floor with this package's inputs and figures, written by hand.

    What the trainer must do, and nothing else: mirrored calls on inputs
    converted once (one-hot actions), gathered once per batch and sliced per
    minibatch; imitation's clipped logits (threshold 50); and the figures
    imitation's trainer logs per step: the loss, the accuracy, the per-pair
    losses and the gradient norm. MLP only (the CNNs' frames are converted per
    call by every implementation).
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.onehot = F.one_hot(self.acts, N_ACTIONS).float()
        self.dones = th.zeros(self.acts.shape)
        self.params = list(self.net.parameters())

    def epoch(self):
        """One epoch: a fresh permutation, batches, minibatches, the figures."""
        n = len(self.prefs)
        order = self.rng.permutation(n)
        for b in range(0, n, self.batch_size):
            batch = th.as_tensor(order[b : b + self.batch_size])
            sides = [
                tuple(t[idx].flatten(0, 1) for t in (self.obs, self.onehot, self.dones))
                for idx in (2 * batch, 2 * batch + 1)
            ]
            prefs = self.prefs[batch]
            length = self.obs.shape[1]
            self.optim.zero_grad()
            loss_sums, corrects, item_losses = [], [], []
            for m in range(0, len(batch), self.minibatch_size):
                pairs = slice(m, m + self.minibatch_size)
                rows = slice(m * length, (m + self.minibatch_size) * length)
                returns = []
                for obs, onehot, dones in sides:
                    rews = self.net(obs[rows], onehot[rows], obs[rows], dones[rows])
                    returns.append(rews.reshape(-1, length).sum(1))
                logits = th.clamp(returns[0] - returns[1], -50.0, 50.0)
                losses = F.binary_cross_entropy_with_logits(
                    logits, prefs[pairs], reduction="none"
                )
                loss = losses.sum()
                (loss / len(batch)).backward()
                probs = th.sigmoid(logits.detach())
                corrects.append(((probs > 0.5) == (prefs[pairs] > 0.5)).sum())
                loss_sums.append(loss.detach())
                item_losses.append(losses.detach())
            self.figures = (
                float(th.stack(loss_sums).sum()) / len(batch),
                float(th.stack(corrects).sum()) / len(batch),
                th.cat(item_losses).numpy(),
                float(th.nn.utils.get_total_norm([p.grad for p in self.params])),
            )
            self.optim.step()


#: What each repeat times, in this order (reversed every other repeat).
IMPLS = ("imitation", "accum", "floor", "exact-floor")
#: The bare loops, by the name the table gives them.
FLOORS = {"floor": FloorLoop, "exact-floor": ExactFloorLoop}
#: glibc malloc settings the bare loops run with: those of the trainer's
#: ``reuse_host_memory`` (imitation_accum.engine.host_memory), so that a floor
#: does not lose time to page faults that the trainer avoids.
FLOOR_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),
}


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
        env={
            **os.environ,
            **(FLOOR_MALLOC_ENV if impl in FLOORS else {}),
            **(env or {}),
        },
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def competitor() -> None:
    """--busy's competing job: matrix multiplies on every core, until killed."""
    th.set_num_threads(os.cpu_count() or 1)
    a = th.randn(COMPETITOR_MATRIX, COMPETITOR_MATRIX)
    b = th.randn(COMPETITOR_MATRIX, COMPETITOR_MATRIX)
    th.mm(a, b)
    print("ready", flush=True)
    while True:
        a = th.mm(a, b).clamp_(-1, 1)


class Competitor:
    """Runs :func:`competitor` in a separate process for the ``with`` block."""

    def __enter__(self):
        cmd = [sys.executable, __file__, "--competitor"]
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the competing job did not start")
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "CONFIG"))
    parser.add_argument("--competitor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--epochs", type=int, help="epochs per timed call (default: per config)"
    )
    parser.add_argument("--minibatch", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--one-pass", action="store_true")
    parser.add_argument("--pairs", type=int, help="worker: pairs in the dataset")
    parser.add_argument("--length", type=int, help="worker: fragment length")
    parser.add_argument("--threads", type=int, help="worker: intra-op threads")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds, to check it runs: mlp only, 2 epochs, 1 repeat",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", nargs="*", choices=list(CONFIGS))
    parser.add_argument(
        "--busy",
        action="store_true",
        help="also measure every point with a competing PyTorch job (a "
        "matrix-multiply loop on every core, in its own process) running",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="LOG",
        help="the standard output of a run of the same checkout that was cut "
        "short: its whole repeats are kept, and each configuration goes on from "
        "the first repeat it lacks",
    )
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--same-process", action="store_true")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    _results.resolve_out_dir(args)
    if args.resume is not None and not args.resume.is_file():
        parser.error(f"--resume: {args.resume} is not a file")
    if args.competitor:
        competitor()
        return
    if args.worker:
        result = worker(
            *args.worker,
            args.epochs or EPOCHS[args.worker[1]],
            args.minibatch,
            args.batch,
            args.one_pass,
            args.pairs,
            args.length,
            args.threads,
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
    configs = args.configs or (["mlp"] if args.quick else list(CONFIGS))
    modes = ("quiet", "busy") if args.busy else ("quiet",)
    runs = resumed_points(args.resume, repeats) if args.resume else {}
    for config in {config for config, _ in runs}:
        whole_repeats(runs, config, modes)  # an unfinished repeat is redone
    # Fresh processes, interleaved within a configuration: every repeat
    # measures each of its points once (order alternating), so that drifting
    # load reaches them alike. The table is rewritten after every repeat, so
    # that a run cut short still leaves what it measured (and --resume goes on).
    for config in configs:
        epochs = 2 if args.quick else (args.epochs or EPOCHS[config])
        for repeat in range(whole_repeats(runs, config, modes), repeats):
            for mode in modes:
                order = IMPLS
                if repeat % 2:
                    order = order[::-1]
                with Competitor() if mode == "busy" else contextlib.nullcontext():
                    for impl in order:
                        n = epochs
                        if impl == "imitation" and not args.epochs:
                            n = min(epochs, IMITATION_EPOCHS.get(config, epochs))
                        # A busy floor runs one thread: with torch's team of
                        # two waiting for taken cores, one point ran for
                        # minutes (the trainer decides this by measuring).
                        one = mode == "busy" and impl in FLOORS
                        run = run_worker(
                            impl, config, n, **({"threads": 1} if one else {})
                        )
                        runs.setdefault((config, mode), {}).setdefault(impl, []).append(
                            run
                        )
                        print(json.dumps({"mode": mode, **run}), flush=True)
            write_tables(runs, args.out_dir, repeats)
    write_tables(runs, args.out_dir, repeats)


def resumed_points(log: Path, repeats: int) -> dict:
    """The points a run cut short printed: ``(config, mode) -> impl -> points``.

    Only whole repeats count (:func:`whole_repeats` trims the rest), at most
    ``repeats`` of them.
    """
    runs: dict = {}
    for line in log.read_text().splitlines():
        try:
            point = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(point, dict) or "mode" not in point:
            continue
        mode = point.pop("mode")
        key = (point["config"], mode)
        runs.setdefault(key, {}).setdefault(point["impl"], []).append(point)
    for by_impl in runs.values():
        for impl, points in by_impl.items():
            by_impl[impl] = points[:repeats]
    return runs


def whole_repeats(runs: dict, config: str, modes) -> int:
    """Repeats of ``config`` with every point measured; later points dropped.

    A repeat measures each mode's points in turn, so a run cut short may leave
    part of one; those points are measured again with the rest of it.
    """
    counts = [
        len(runs.get((config, mode), {}).get(impl, []))
        for mode in modes
        for impl in IMPLS
    ]
    whole = min(counts)
    for mode in modes:
        for points in runs.get((config, mode), {}).values():
            del points[whole:]
    return whole


def _median(values):
    return float(np.median(values))


def write_tables(runs, out_dir: Path, repeats: int) -> None:
    """The table of medians; ratios are medians of each repeat's ratio."""
    header = (
        "config",
        "batch / minibatch",
        "imitation 1.0.1 s/epoch",
        "accum s/epoch",
        "floor s/epoch",
        "exact floor s/epoch",
        "imitation / accum",
        "accum / floor",
        "accum / exact floor",
        "accum forward_size",
        "floor forward_size",
        "floor intra-op threads",
        "machine",
        "load average (1 min)",
        "first train() s",
        "peak RSS MiB (imitation / accum / floor / exact floor)",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = []
    order = list(CONFIGS)
    for (config, mode), r in sorted(runs.items(), key=lambda r: order.index(r[0][0])):
        if not all(r.get(impl) for impl in IMPLS):
            continue  # a repeat cut short before its last point
        i, a, f, e = r["imitation"], r["accum"], r["floor"], r["exact-floor"]

        def secs(rs):
            return [x["seconds_per_epoch"] for x in rs]

        t_i, t_a, t_f = _median(secs(i)), _median(secs(a)), _median(secs(f))
        t_e = _median(secs(e))
        speedup = _median([x / y for x, y in zip(secs(i), secs(a))])
        to_floor = _median([x / y for x, y in zip(secs(a), secs(f))])
        to_exact = _median([x / y for x, y in zip(secs(a), secs(e))])
        sizes = sorted({str(x["forward_size"]) for x in a})
        two_pass = any(x.get("two_pass") for x in a)
        accum_size = "/".join(sizes) + (" (two-pass)" if two_pass else "")
        if _threads(a):
            accum_size += f" ({_threads(a)})"
        floor_sizes = "/".join(sorted({str(x["forward_size"]) for x in f + e}))
        loads = [x["load_average"] for x in i + a + f + e]
        first = _median([x["first_train_seconds"] for x in a])
        rows.append(
            {
                "config": config,
                "mode": mode,
                "batch_size": a[0]["batch_size"],
                "minibatch_size": a[0]["minibatch_size"],
                "repeats": len(a),
                "seconds_per_epoch": {
                    "imitation": t_i,
                    "accum": t_a,
                    "floor": t_f,
                    "exact_floor": t_e,
                },
                "imitation_over_accum": speedup,
                "accum_over_floor": to_floor,
                "accum_over_exact_floor": to_exact,
                "accum_forward_size": accum_size,
                "floor_forward_size": floor_sizes,
                "load_average": {
                    "median": _median(loads),
                    "min": min(loads),
                    "max": max(loads),
                },
                "first_train_seconds": first,
            }
        )
        lines.append(
            f"| {config} | {a[0]['batch_size']} / {a[0]['minibatch_size']} "
            f"| {t_i:.4g} | {t_a:.4g} | {t_f:.4g} | {t_e:.4g} "
            f"| {speedup:.2f}x | {to_floor:.2f}x | {to_exact:.2f}x "
            f"| {accum_size} | {floor_sizes} | {_threads(f + e) or '—'} "
            f"| {mode} "
            f"| {_median(loads):.2f} ({min(loads):.2f}-{max(loads):.2f}) "
            f"| {first:.3g} "
            f"| {_median([x['peak_rss_mib'] for x in i]):.0f} "
            f"/ {_median([x['peak_rss_mib'] for x in a]):.0f} "
            f"/ {_median([x['peak_rss_mib'] for x in f]):.0f} "
            f"/ {_median([x['peak_rss_mib'] for x in e]):.0f} |",
        )
    done = {
        f"{config} {mode}: {len(r['accum'])}"
        for (config, mode), r in runs.items()
        if r.get("accum")
    }
    lines += [
        "",
        f"Repeats measured per row ({repeats} asked for): {', '.join(sorted(done))}.",
        "",
        f"Medians of the repeats, each point in a fresh process, the repeats "
        "interleaved within a configuration (every point once per repeat); "
        "ratios are medians of the "
        "ratios within a repeat. busy: a competing PyTorch job (a "
        f"{COMPETITOR_MATRIX}x{COMPETITOR_MATRIX} matrix-multiply loop with one "
        "intra-op thread per core, in its own process) runs during the point. "
        "First train(): the whole one-epoch first call (the probe included). "
        "Load average: "
        "the median (range) of /proc/loadavg's one-minute figure at the start of "
        "the points. Floor: the bare loop, a minibatch's fragments interleaved in "
        "its calls; exact floor: the bare loop with this package's mirrored "
        "calls (each side of the pairs end to end, call k of one side then of "
        "the other), which exact zeros under AdamW need (docs/exactness.md). "
        "In busy rows both floors run one intra-op thread (with torch's "
        "two, a busy floor point ran for minutes); in quiet rows the faster of "
        "one thread and torch's count in a one-epoch trial. accum forward_size "
        "names the intra-op threads of the trainer's calls (its thread policy, "
        "docs/forward_size.md). "
        "Both floors run with the glibc malloc settings of the trainer's "
        "reuse_host_memory (MALLOC_MMAP_THRESHOLD_=32 MiB, "
        "MALLOC_TRIM_THRESHOLD_=2 GiB); imitation runs with glibc's defaults, "
        f"as its users do; commit {_results_commit()}.",
    ]
    write(out_dir / "bench_reward_trainer.md", lines)
    made_by = _results.made_by()
    (out_dir / "bench_reward_trainer.json").write_text(
        json.dumps({"made_by": made_by, "results": rows}, indent=1) + "\n"
    )
    if rows:
        plot_speed(rows, out_dir / "bench_reward_trainer.png", made_by)
    print(f"wrote {out_dir / 'bench_reward_trainer'}.{{json,png}}")


def plot_speed(rows, path: Path, made_by: str) -> None:
    """Bars of each implementation's time per epoch over the floor's, per row."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    impls = (
        ("imitation", "imitation 1.0.1"),
        ("accum", "imitation-accum"),
        ("exact_floor", "bare loop, mirrored calls (exact floor)"),
        ("floor", "bare PyTorch loop (floor)"),
    )
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.2))
    width = 0.8 / len(impls)
    for k, (impl, label) in enumerate(impls):
        xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(rows))]
        ys = [
            r["seconds_per_epoch"][impl] / r["seconds_per_epoch"]["floor"] for r in rows
        ]
        ax.bar(xs, ys, width, label=label)
    ax.axhline(1, color="gray", linewidth=0.8, linestyle=":")
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(
        [
            f"{r['config']} ({r['mode']})\nbatch {r['batch_size']} / "
            f"minibatch {r['minibatch_size']}"
            for r in rows
        ],
        fontsize=8,
    )
    ax.set_ylabel("time per epoch / bare loop's (log scale)")
    ax.set_title(
        "Reward-model training speed: imitation 1.0.1, imitation-accum, bare loops",
        fontsize=10,
    )
    ax.legend(fontsize=7)
    fig.text(0.005, 0.005, made_by.replace("`", ""), fontsize=5, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110, metadata={"Description": made_by})
    plt.close(fig)


def _threads(points) -> str:
    """The intra-op thread counts the points ran with ("" if none recorded)."""
    counts = sorted({str(x["threads"]) for x in points if x.get("threads")})
    if not counts:  # points of an older run (--resume)
        return ""
    return "/".join(counts) + (" thread" if counts == ["1"] else " threads")


def _results_commit() -> str:
    """The commit measured, ``-dirty`` if files other than the tables differ."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=root
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        # The tables are rewritten during the run: they do not make it dirty.
        changed = git("status", "--porcelain", "--", ".", ":(exclude)docs/results")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return (commit + ("-dirty" if changed else "")) or "unknown"


def write(path: Path, lines) -> None:
    """Writes the table ``lines`` to ``path``, then the line naming its maker."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_results.with_made_by("\n".join(lines)))
    print("\n".join(lines))
    print(f"wrote {path}")


# config -> (forward sizes, epochs per timed call)
SAME_PROCESS = {"mlp": ((1600,), 100), "cnn84-100": ((4, 8), 2)}


def same_process_table(out_dir: Path, repeats: int, configs, quick=False) -> None:
    """This trainer against the bare loops in one process, same forward sizes.

    ``mlp`` also times :class:`FiguresLoop`, the exact loop by hand with the
    trainer's inputs and figures. The exact floor's calls cover each side of a
    minibatch, half of the floor's, so they run at half its forward size.
    """
    lines = [
        "| config | forward_size | accum s/epoch | floor s/epoch "
        "| exact floor s/epoch | by hand, with figures s/epoch "
        "| accum / floor | accum / exact floor | by hand / floor "
        "| accum / by hand |",
        "|---|---|---|---|---|---|---|---|---|---|",
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
            args = (net, dataset, batch_size, minibatch_size)
            loops = {
                "accum": functools.partial(train_epochs, trainer, dataset),
                "floor": FloorLoop(*args, size).epochs,
                "exact": ExactFloorLoop(*args, max(1, size // 2)).epochs,
            }
            if kind == "mlp":
                loops["hand"] = FiguresLoop(*args, max(1, size // 2)).epochs
            times: dict = {name: [] for name in loops}
            for _ in range(repeats):  # interleaved; the fastest of each counts
                for name, run in loops.items():
                    times[name].append(time_epochs(run, epochs))
            best = {name: min(values) for name, values in times.items()}
            hand = best.get("hand")

            def ratio(a, b):
                return "—" if a is None or b is None else f"{a / b:.2f}x"

            lines.append(
                f"| {config} | {size} | {best['accum']:.4g} | {best['floor']:.4g} "
                f"| {best['exact']:.4g} | {'—' if hand is None else f'{hand:.4g}'} "
                f"| {ratio(best['accum'], best['floor'])} "
                f"| {ratio(best['accum'], best['exact'])} "
                f"| {ratio(hand, best['floor'])} | {ratio(best['accum'], hand)} |",
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        f"The fastest of {repeats} interleaved timings per point, in one process, "
        "each of one train() or loop call of "
        + ", ".join(
            f"{2 if quick else SAME_PROCESS[c][1]} epochs ({c})" for c in configs
        )
        + "; floor: a minibatch's fragments interleaved in calls of "
        "forward_size; exact floor: the pairs' sides end to end, calls of half of "
        "it mirrored; by hand, with figures (mlp): the exact floor on inputs "
        "converted once, with imitation's clipped logits and the figures the "
        "trainer logs (loss, accuracy, per-pair losses, gradient norm); "
        f"commit {_results_commit()}.",
    ]
    write(out_dir / "bench_reward_trainer_same_process.md", lines)


def memory_table(out_dir: Path, epochs: int, quick=False) -> None:
    """Training memory of ``cnn84`` against batch and minibatch size.

    ``quick``: batch 4, minibatch sizes 1 and 2, short fragments.
    """
    env = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    data = QUICK_MEMORY_DATA if quick else {"pairs": 8}
    runs = []
    for batch in (4,) if quick else (4, 8):
        for minibatch in (1, 2) if quick else (1, 2, 4):
            runs.append(
                run_worker(
                    "accum",
                    "cnn84-100",
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
    lines += ["", f"Each point in a fresh process; commit {_results_commit()}."]
    write(out_dir / "bench_reward_trainer_memory.md", lines)


if __name__ == "__main__":
    main()
