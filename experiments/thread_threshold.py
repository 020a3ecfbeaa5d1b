"""Where a second intra-op thread starts to pay: the measurement behind a constant.

``imitation_accum.planning.threads.CALL_BYTES_PER_THREAD`` gives a reward-net call
one intra-op thread per that many bytes of activations (as the memory probe counts
them). This script times one training call (forward with gradient, then backward)
of imitation's ``BasicRewardNet`` (4-dim observations) and ``CnnRewardNet``
(84x84x4 frames) at several call sizes, with one thread and with one per core, the
thread counts interleaved; each figure is the fastest of ``--repeats`` timings (a
shared machine's intermittent load only slows a timing down), each the mean of
calls that together take at least ``--seconds``. The bytes of a call are the
probe's (``planning.probe.profile_activations``, with the trainer's input bytes).

Two runs, each in its own process:

- ``wall``: wall-clock time, as PyTorch runs by default (OpenMP threads spin while
  they wait), at the machine's load: what a training step sees.
- ``cpu``: the calling thread's CPU time (``time.thread_time``), with
  ``OMP_WAIT_POLICY=passive`` so that a thread waiting for its team sleeps rather
  than spins. The calling thread runs a call's serial parts and its share of each
  parallel region, so this is the call's time on cores of its own, whatever other
  jobs run: the quiet figure, measurable on a shared machine, from which the
  constant is set (where the machine is quiet, the wall-clock ratios agree).

The table gives each point's bytes per call and per thread, the times and ratios,
and the threads the constant gives; the line under it, the smallest bytes per
thread from which every larger point ran at least ``MIN_SPEEDUP`` times faster in
CPU time on all cores than on one. The constant is set from it, by hand, once:
the trainers time nothing.

Usage::

    python experiments/thread_threshold.py            # docs/results/
    python experiments/thread_threshold.py --quick    # seconds, output/experiments/
    python experiments/thread_threshold.py --quick --out-dir /tmp/threads
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import torch as th
from torch.nn import functional as F  # noqa: N812

import _results
from bench_reward_trainer import N_ACTIONS, load_average, make_net
from imitation_accum.planning import probe, threads

#: Workloads: (observation shape, net kind, transitions per call timed).
WORKLOADS = {
    "mlp": ((4,), "mlp", (200, 800, 3200, 12800, 51200)),
    "cnn84": ((84, 84, 4), "cnn", (1, 2, 4, 16)),
}
QUICK_SIZES = {"mlp": (200, 3200), "cnn84": (1, 2)}
#: All cores must beat one by this much (in CPU time) for a call to get them.
MIN_SPEEDUP = 1.25


class Call:
    """One training call of a reward net on the first ``n`` of its transitions."""

    def __init__(self, shape, kind, largest: int):
        th.manual_seed(0)
        self.net = make_net(shape, kind)
        self.image = kind == "cnn"
        if self.image:
            self.obs = th.randint(0, 256, (largest, *shape), dtype=th.uint8)
        else:
            self.obs = th.randn(largest, *shape)
        self.acts = th.randint(0, N_ACTIONS, (largest,))
        self.input_bytes = 2 * 4 * int(np.prod(shape))  # obs, next_obs as float32

    def forward(self, n: int) -> th.Tensor:
        """The rewards of the first ``n`` transitions (with gradient)."""
        obs = self.obs[:n].float() / 255.0 if self.image else self.obs[:n]
        onehot = F.one_hot(self.acts[:n], N_ACTIONS).float()
        return self.net(obs, onehot, obs, th.zeros(n))

    def train_call(self, n: int) -> None:
        """Forward with gradient and backward, as a step's call."""
        self.forward(n).sum().backward()

    def bytes_per_call(self, n: int) -> float:
        """Activation bytes of a call of ``n``, as the trainer's probe counts them."""
        profile = probe.profile_activations(
            self.forward,
            max_transitions=n,
            params=list(self.net.parameters()),
            device=th.device("cpu"),
            fixed_bytes=0,
            input_bytes_per_transition=self.input_bytes,
        )
        policy = threads.ThreadPolicy(
            profile.saved_per_transition + profile.transient_per_transition,
            profile.saved_per_call,
            cores=1,
        )
        return n * policy.bytes_per_transition + policy.bytes_per_call


def time_call(call: Call, n: int, n_threads: int, seconds: float) -> tuple:
    """Mean wall-clock and calling-thread CPU seconds of a training call of ``n``."""
    with threads.intra_op(n_threads):
        call.train_call(n)  # warm-up
        calls, start, cpu = 0, time.perf_counter(), time.thread_time()
        while calls < 3 or time.perf_counter() - start < seconds:
            call.train_call(n)
            calls += 1
        wall = (time.perf_counter() - start) / calls
        return wall, (time.thread_time() - cpu) / calls


def worker(quick: bool, cores: int, repeats: int, seconds: float) -> list:
    """Points of every workload: (net, n, bytes, {threads: (wall, cpu)})."""
    rows = []
    for name, (shape, kind, sizes) in WORKLOADS.items():
        sizes = QUICK_SIZES[name] if quick else sizes
        call = Call(shape, kind, max(sizes))
        for n in sizes:
            best = {1: [math.inf, math.inf], cores: [math.inf, math.inf]}
            for repeat in range(repeats):  # thread counts interleaved
                for count in (1, cores) if repeat % 2 == 0 else (cores, 1):
                    timed = time_call(call, n, count, seconds)
                    best[count] = [min(b, t) for b, t in zip(best[count], timed)]
            rows.append([name, n, call.bytes_per_call(n), best[1], best[cores]])
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def run_worker(clock: str, args: argparse.Namespace, cores: int) -> list:
    """:func:`worker` in a fresh process; ``cpu``: with passive OpenMP waiting."""
    env = dict(os.environ)
    if clock == "cpu":
        env["OMP_WAIT_POLICY"] = "passive"
    cmd = [sys.executable, __file__, "--worker", "--cores", str(cores)]
    cmd += ["--repeats", str(args.repeats), "--seconds", str(args.seconds)]
    cmd += ["--quick"] if args.quick else []
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env)
    return json.loads(out.stdout)


def suggested_threshold(rows, cores: int) -> Optional[float]:
    """Bytes per thread from which on every point's CPU-time ratio is good enough.

    The smallest per-thread bytes from which every larger point's ratio reached
    :data:`MIN_SPEEDUP`; ``None`` if the largest did not.
    """
    points = sorted((b / cores, one[1] / team[1]) for _, _, b, one, team in rows)
    threshold = None
    for per_thread, speedup in reversed(points):
        if speedup < MIN_SPEEDUP:
            break
        threshold = per_thread
    return threshold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few points, once")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, help=argparse.SUPPRESS)
    _results.add_out_dir(parser)
    args = parser.parse_args()
    _results.resolve_out_dir(args)
    if args.quick:
        args.repeats, args.seconds = 1, 0.02
    if args.worker:
        print(json.dumps(worker(args.quick, args.cores, args.repeats, args.seconds)))
        return
    cores = max(2, threads.usable_cores())  # one core: two threads on it
    loads = [load_average()]
    wall = run_worker("wall", args, cores)
    loads.append(load_average())
    cpu = run_worker("cpu", args, cores)
    loads.append(load_average())
    mib = 2**20
    header = [
        "net",
        "transitions per call",
        "MiB per call",
        f"MiB per thread ({cores} threads)",
        "wall: 1 thread ms",
        f"wall: {cores} threads ms",
        f"wall: 1 / {cores} threads",
        "CPU: 1 thread ms",
        f"CPU: {cores} threads ms",
        f"CPU: 1 / {cores} threads",
        "threads given",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (name, n, call_bytes, w1, wc), (*_, c1, cc) in zip(wall, cpu):
        cells = [name, str(n), f"{call_bytes / mib:.3g}"]
        cells.append(f"{call_bytes / cores / mib:.3g}")
        for one, team in ((w1[0], wc[0]), (c1[1], cc[1])):
            cells += [f"{1e3 * one:.3g}", f"{1e3 * team:.3g}", f"{one / team:.2f}x"]
        cells.append(str(threads.intra_op_threads(call_bytes, cores)))
        lines.append("| " + " | ".join(cells) + " |")
    threshold = suggested_threshold(cpu, cores)
    found = "none" if threshold is None else f"{threshold / mib:.3g} MiB"
    lines += [
        "",
        f"Smallest MiB per thread from which every larger point ran at least "
        f"{MIN_SPEEDUP}x faster on {cores} threads than on one, in CPU time: "
        f"{found}. CALL_BYTES_PER_THREAD is "
        f"{threads.CALL_BYTES_PER_THREAD / mib:g} MiB (threads given: one per "
        "that many bytes of a call, at least one, at most the cores).",
        "",
        "One training call (forward with gradient, backward) of imitation's "
        "BasicRewardNet (4-dim observations, 6 actions) and CnnRewardNet (84x84x4 "
        "uint8 frames); bytes as the trainer's memory probe counts them (saved and "
        f"transient activations). Each time is the fastest of {args.repeats} "
        "timings (thread counts interleaved), each the mean of calls over at "
        f"least {args.seconds:g} s. wall: wall-clock time, PyTorch's defaults "
        "(waiting threads spin), at the load below; CPU: the calling thread's CPU "
        "time with OMP_WAIT_POLICY=passive (waiting threads sleep), the call's "
        "time on cores of its own. Each in its own process. Load average (1 min) "
        f"before, between and after: {', '.join(f'{x:.2f}' for x in loads)}; "
        f"{os.cpu_count()} CPUs.",
    ]
    path = args.out_dir / "thread_threshold.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_results.with_made_by("\n".join(lines)))
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
