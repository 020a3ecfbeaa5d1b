"""Pairs per second of offline reward-model training on 1, 2, ... processes.

Each process count runs in a fresh ``torchrun`` job (gloo on CPUs, NCCL on GPUs)
training :class:`imitation_accum.DistributedRewardTrainer` on the same synthetic
preference dataset; one epoch warms up, the following ones are timed between
barriers. The table gives pairs per second over all processes and the ratio to
one process. On a CPU machine the processes share its cores (each gets
``cores // processes`` threads), so the figure shows the overhead of splitting
rather than a speed-up; on GPUs each process has its own device.

Usage::

    python experiments/bench_distributed.py --processes 1 2
    python experiments/bench_distributed.py --net cnn --pairs 64 --fragment-length 25
    python experiments/bench_distributed.py --device cuda --processes 1 2 4 8
        --net cnn --pairs 2048 --batch-size 256 --minibatch-size 32  (one line)
    python experiments/bench_distributed.py --quick --out-dir /tmp/distributed

Writes ``bench_distributed.{md,json}`` to ``--out-dir`` (default
``docs/results/``, the committed figures; with ``--quick``,
``output/experiments/``, which git ignores; ``--json FILE`` names the JSON file).
``--quick`` checks that the script runs, in seconds: 1 and 2 processes of one
thread each, 32 pairs of 5-step fragments, batch 16, one timed epoch (flags given
explicitly still count); its figures mean little.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

import _results

#: --quick: the defaults it changes.
QUICK = {
    "processes": [1, 2],
    "pairs": 32,
    "fragment_length": 5,
    "batch_size": 16,
    "epochs": 1,
    "threads": 1,
}


def synthetic_dataset(args: argparse.Namespace):
    """Random fragments and preferences, identical on every rank (seeded)."""
    from imitation.algorithms import preference_comparisons as pc
    from imitation.data.types import TrajectoryWithRew

    rng = np.random.default_rng(0)
    shape = (84, 84, 4) if args.net == "cnn" else (args.obs_dim,)
    pairs = []
    for _ in range(args.pairs):
        pair = []
        for _ in range(2):
            if args.net == "cnn":
                obs = rng.integers(0, 256, (args.fragment_length + 1, *shape), np.uint8)
            else:
                obs = rng.normal(size=(args.fragment_length + 1, *shape))
                obs = obs.astype(np.float32)
            pair.append(
                TrajectoryWithRew(
                    obs=obs,
                    acts=rng.integers(0, 6, args.fragment_length),
                    infos=None,
                    terminal=False,
                    rews=np.zeros(args.fragment_length, np.float32),
                ),
            )
        pairs.append(tuple(pair))
    dataset = pc.PreferenceDataset()
    dataset.push(pairs, rng.uniform(size=args.pairs).astype(np.float32))
    return dataset, shape


def make_net(args: argparse.Namespace, shape):
    import gymnasium as gym
    from imitation.rewards import reward_nets
    from imitation.util import networks

    actions = gym.spaces.Discrete(6)
    if args.net == "cnn":
        space = gym.spaces.Box(0, 255, shape, np.uint8)
        return reward_nets.CnnRewardNet(space, actions, hwc_format=True)
    space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
    return reward_nets.BasicRewardNet(
        space,
        actions,
        hid_sizes=(256, 256),
        normalize_input_layer=networks.RunningNorm,
    )


def worker(args: argparse.Namespace) -> None:
    """One rank of a ``torchrun`` job: trains, times, rank 0 writes the figures."""
    import torch as th
    import torch.distributed as dist
    from imitation.algorithms import preference_comparisons as pc
    from imitation.util import logger as imit_logger

    from imitation_accum import distributed

    th.set_num_threads(args.threads)
    with (
        distributed.distributed_session(args.device) as context,
        tempfile.TemporaryDirectory() as scratch,
    ):
        dataset, shape = synthetic_dataset(args)
        th.manual_seed(0)
        net = make_net(args, shape).to(context.device)
        trainer = distributed.DistributedRewardTrainer(
            pc.PreferenceModel(net),
            pc.CrossEntropyRewardLoss(),
            np.random.default_rng(0),
            batch_size=args.batch_size,
            minibatch_size=args.minibatch_size,
            forward_size=args.forward_size,
            custom_logger=imit_logger.configure(scratch, format_strs=[]),
            progress_bar=False,
        )

        def barrier() -> None:
            if context.distributed:
                dist.barrier()
            if context.device.type == "cuda":
                th.cuda.synchronize(context.device)

        trainer.train(dataset)  # warm-up (and the memory probe if "auto")
        barrier()
        start = time.perf_counter()
        for _ in range(args.epochs):
            trainer.train(dataset)
        barrier()
        seconds = time.perf_counter() - start
        if context.is_main:
            figures = {
                "processes": context.world_size,
                "threads_per_process": args.threads,
                "device": str(context.device.type),
                "backend": context.backend or "none",
                "seconds": seconds,
                "pairs_per_second": args.pairs * args.epochs / seconds,
                "forward_size": trainer.last_plan.forward_size,
            }
            pathlib.Path(args.output).write_text(json.dumps(figures))


def launch(args: argparse.Namespace, processes: int, output: str) -> Dict[str, Any]:
    """Runs one process count as a fresh torchrun job."""
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // processes)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        __file__,
        "--worker",
        "--output",
        output,
        "--threads",
        str(threads),
        *worker_arguments(args),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{processes} processes failed:\n{(done.stdout + done.stderr)[-4000:]}",
        )
    return json.loads(pathlib.Path(output).read_text())


def worker_arguments(args: argparse.Namespace) -> List[str]:
    names = [
        "net",
        "pairs",
        "fragment_length",
        "obs_dim",
        "batch_size",
        "minibatch_size",
        "forward_size",
        "epochs",
        "device",
    ]
    out: List[str] = []
    for name in names:
        value = getattr(args, name)
        if value is not None:
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def table(rows: List[Dict[str, Any]]) -> str:
    base = rows[0]["pairs_per_second"]
    lines = [
        "| processes | threads each | device | pairs/s | vs 1st row |",
        "|---:|---:|---|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['processes']} | {row['threads_per_process']} | {row['device']} "
            f"({row['backend']}) | {row['pairs_per_second']:.1f} | "
            f"{row['pairs_per_second'] / base:.2f} |",
        )
    return "\n".join(lines)


def parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--net", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--fragment-length", type=int, default=50)
    parser.add_argument("--obs-dim", type=int, default=17)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--minibatch-size", type=int, default=None)
    parser.add_argument("--forward-size", default="512", help="an int or auto")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="0: cores / procs")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds, to check it runs (see the docstring)",
    )
    _results.add_out_dir(parser)
    parser.add_argument(
        "--json", help="the rows' file (default OUT_DIR/bench_distributed.json)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="s per job")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    if "--quick" in argv:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    _results.resolve_out_dir(args)
    if args.forward_size != "auto":
        args.forward_size = int(args.forward_size)
    return args


def main(argv: List[str]) -> None:
    args = parse(argv)
    if args.worker:
        worker(args)
        return
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for processes in args.processes:
            output = str(pathlib.Path(scratch) / f"{processes}.json")
            rows.append(launch(args, processes, output))
            print(json.dumps(rows[-1]), flush=True)
    text = table(rows)
    print(text)
    device = rows[0]["device"]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    md = args.out_dir / "bench_distributed.md"
    md.write_text(_results.with_made_by(text, device))
    made_by = _results.made_by(device)
    out = pathlib.Path(args.json) if args.json else md.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"made_by": made_by, "results": rows}, indent=2))
    print(f"wrote {md} and {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
