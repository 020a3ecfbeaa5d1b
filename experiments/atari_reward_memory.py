r"""Peak memory of reward-model steps on Atari frames, per minibatch size.

Backs the minibatch sizes of the GPU presets in ``configs/``. For each minibatch
size, a fresh process builds the reward net the Atari named configs build
(imitation's ``CnnRewardNet`` with defaults, ``RunningNorm`` output normalization),
a dataset of ``batch`` fragment pairs of random uint8 frames, and trains
``CrossEntropyRewardTrainer`` for ``--steps`` steps of one batch each. It reports
the peak memory of a step (``torch.cuda.max_memory_allocated`` and ``..._reserved``
on CUDA; the process's peak RSS on CPU) and seconds per step, beside the estimate
the presets use: the bytes autograd saves for one pair (counted once per tensor)
times the minibatch size.

Usage::

    python experiments/atari_reward_memory.py --device cuda \
        --frames 84x84x4 --batch 128 --minibatches 32,48,64,128
    python experiments/atari_reward_memory.py --device cuda \
        --frames 210x160x3 --batch 30 --minibatches 6,10,15,30
    python experiments/atari_reward_memory.py --quick --out-dir /tmp/atari  # CPU

Writes ``atari_reward_memory_<frames>.{md,json}`` (e.g.
``atari_reward_memory_84x84x4.md``) to ``--out-dir`` (default ``docs/results/``;
with ``--quick``, ``output/experiments/``, which git ignores). ``--quick`` checks
that the script runs, in seconds: on the CPU, batch 4, minibatch sizes 2 and 4,
5-frame fragments, one step; its figures mean little.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import torch as th
from gymnasium import spaces
from imitation.algorithms import preference_comparisons as pc
from imitation.data.types import TrajectoryWithRew
from imitation.rewards import reward_nets
from imitation.util import networks

import _results
from imitation_accum import CrossEntropyRewardTrainer

GIB = 2**30


def build_net(frames: Tuple[int, ...], device: str) -> reward_nets.RewardNet:
    net = reward_nets.CnnRewardNet(
        spaces.Box(0, 255, frames, np.uint8),
        spaces.Discrete(6),
    )
    return reward_nets.NormalizedRewardNet(net, networks.RunningNorm).to(device)


def saved_bytes_per_pair(frames: Tuple[int, ...], fragment_length: int) -> int:
    """Bytes autograd saves for one pair's forward, each tensor counted once."""
    net = build_net(frames, "cpu")
    n = 2 * fragment_length
    obs = np.random.default_rng(0).integers(0, 256, (n, *frames), dtype=np.uint8)
    acts = np.zeros(n, dtype=np.int64)
    storages: Dict[int, int] = {}

    def pack(tensor: th.Tensor) -> th.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with th.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net.base(*net.base.preprocess(obs, acts, obs, np.zeros(n, bool)))
    params = sum(p.untyped_storage().nbytes() for p in net.parameters())
    return sum(storages.values()) - params


def dataset(
    frames: Tuple[int, ...],
    pairs: int,
    fragment_length: int,
    rng: np.random.Generator,
) -> pc.PreferenceDataset:
    def fragment() -> TrajectoryWithRew:
        return TrajectoryWithRew(
            obs=rng.integers(0, 256, (fragment_length + 1, *frames), dtype=np.uint8),
            acts=rng.integers(0, 6, fragment_length),
            infos=None,
            terminal=False,
            rews=rng.normal(size=fragment_length).astype(np.float32),
        )

    data = pc.PreferenceDataset()
    fragment_pairs = [(fragment(), fragment()) for _ in range(pairs)]
    data.push(fragment_pairs, rng.random(pairs).astype(np.float32))
    return data


def measure(args: Dict[str, Any]) -> Dict[str, Any]:
    frames = tuple(args["frames"])
    device = args["device"]
    rng = np.random.default_rng(0)
    net = build_net(frames, device)
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        rng,
        batch_size=args["batch"],
        minibatch_size=args["minibatch"],
        progress_bar=False,
    )
    data = dataset(frames, args["batch"], args["fragment_length"], rng)
    trainer.train(data)  # warm-up: CUDA context, cuDNN, the memory probe
    if device.startswith("cuda"):
        th.cuda.synchronize()
        th.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args["steps"]):
        trainer.train(data)
    if device.startswith("cuda"):
        th.cuda.synchronize()
        allocated = th.cuda.max_memory_allocated() / GIB
        reserved = th.cuda.max_memory_reserved() / GIB
    else:
        allocated = reserved = (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        )
    return dict(
        args,
        seconds_per_step=(time.perf_counter() - start) / args["steps"],
        peak_allocated_gib=allocated,
        peak_reserved_gib=reserved,
        forward_size=trainer.last_plan.forward_size,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if th.cuda.is_available() else "cpu")
    parser.add_argument("--frames", default="84x84x4")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--minibatches", default="32,48,64,128")
    parser.add_argument("--fragment-length", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny sizes on CPU")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    _results.add_out_dir(parser)
    args = parser.parse_args()
    _results.resolve_out_dir(args)
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    if args.quick:
        args.device, args.batch, args.minibatches = "cpu", 4, "2,4"
        args.fragment_length, args.steps = 5, 1
    frames = tuple(int(x) for x in args.frames.split("x"))
    per_pair = saved_bytes_per_pair(frames, args.fragment_length) / GIB
    print(f"frames {frames}: autograd saves {per_pair:.3f} GiB per pair")
    rows: List[Dict[str, Any]] = []
    for minibatch in (int(m) for m in args.minibatches.split(",")):
        child = dict(
            frames=frames,
            device=args.device,
            batch=args.batch,
            minibatch=minibatch,
            fragment_length=args.fragment_length,
            steps=args.steps,
        )
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(child)],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["estimate_gib"] = per_pair * minibatch
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_results(rows, args, frames, per_pair)


def write_results(
    rows: List[Dict[str, Any]],
    args: argparse.Namespace,
    frames: Tuple[int, ...],
    per_pair: float,
) -> None:
    """The table (Markdown) and the rows (JSON), in ``args.out_dir``."""
    unit = "GiB" if args.device.startswith("cuda") else "GiB (peak RSS)"
    lines = [
        f"CnnRewardNet (RunningNorm output) on {'x'.join(map(str, frames))} frames, "
        f"batch {args.batch} pairs of two {args.fragment_length}-frame fragments, "
        f"device {args.device}: autograd saves {per_pair:.3f} GiB per pair.",
        "",
        f"| minibatch | estimate GiB | peak allocated {unit} | reserved | s/step |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['minibatch']} | {r['estimate_gib']:.1f} | "
            f"{r['peak_allocated_gib']:.1f} | {r['peak_reserved_gib']:.1f} | "
            f"{r['seconds_per_step']:.2f} |",
        )
    text = "\n".join(lines)
    print("\n" + text)
    stem: Path = args.out_dir / f"atari_reward_memory_{'x'.join(map(str, frames))}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(_results.with_made_by(text, args.device))
    made_by = _results.made_by(args.device)
    stem.with_suffix(".json").write_text(
        json.dumps({"made_by": made_by, "results": rows}, indent=1)
    )
    print(f"wrote {stem}.{{md,json}}")


if __name__ == "__main__":
    main()
