"""Speed and memory of the reward-model updates against bare loops, per option.

One table for imitation's ``CnnRewardNet`` (default architecture) on 84x84x4
uint8 frames with 6 actions, two updates:

- **preference**: one optimizer step over a batch of 128 pairs of 25-step
  fragments, minibatches of 16, 32 and 128 pairs;
- **discriminator**: one GAIL discriminator step over 1024 expert and 1024
  generator transitions, minibatches of 256, 512 and 1024 rows.

Rows, for each minibatch size:

- ``bare``: a bare PyTorch loop over frames that already sit on the device
  (uint8, converted per minibatch), per minibatch forward, loss summed and divided
  by the batch, backward; one AdamW step;
- ``bare_host``: the same loop with the frames on the host, each minibatch copied
  to the device (where imitation's data lives);
- ``package``: this package's trainer with its defaults
  (``CrossEntropyRewardTrainer`` with ``forward_size="auto"``, or
  ``GAIL.train_disc`` given the samples);
- ``+pinned_staging``, ``+channels_last``, ``+cudnn_benchmark``, ``+compile``:
  the package with one ``acceleration`` option on; ``+bf16``: with the
  ``gpu_bf16`` preset (``autocast_dtype="bfloat16"``, preference only);
  ``+all``: every option (and bf16 for preference) together.

Figures: frames per second (transitions of the batch over the time per step),
time per step (the median over the timed steps, after warm-up steps), and
``torch.cuda.max_memory_allocated`` over the timed steps (on a CPU, no figure).
Everything runs in one process; ratios compare rows of one run. With
``--time-limit-s`` rows not started by then are listed as not run.

Usage::

    python experiments/gpu_bench.py --device cuda --time-limit-s 240
    python experiments/gpu_bench.py --quick --device cpu --out-dir /tmp/bench

Writes ``gpu_bench_<device>.{md,json}`` to ``--out-dir`` (default
``docs/results/``; with ``--quick``, ``output/experiments/``, which git ignores).
``--quick`` checks that the script runs, in seconds: tiny batches, one timed step,
``torch.compile`` with the ``aot_eager`` backend on a CPU; its figures mean little.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.rewards.reward_nets import CnnRewardNet
from torch.nn import functional as F  # noqa: N812

import _results
from _quiet_logger import quiet_logger
from bench_discriminator import FRAME, N_ACTIONS, BareLoop, make_gail

SPACE = gym.spaces.Box(0, 255, FRAME, np.uint8)
FULL = {
    "pairs": 128,
    "length": 25,
    "pair_minibatches": [16, 32, 128],
    "disc_batch": 1024,
    "disc_minibatches": [256, 512, 1024],
    "steps": 3,
    "warmup": 1,
}
QUICK = {
    "pairs": 4,
    "length": 3,
    "pair_minibatches": [3],
    "disc_batch": 8,
    "disc_minibatches": [5],
    "steps": 1,
    "warmup": 1,
}
OPTIONS: Dict[str, Dict[str, Any]] = {
    "+pinned_staging": {"pinned_staging": True},
    "+channels_last": {"channels_last": True},
    "+cudnn_benchmark": {"cudnn_benchmark": True},
    "+compile": {"compile": True},
}
ALL = {"pinned_staging": True, "channels_last": True, "cudnn_benchmark": True}


def make_net(device: th.device) -> CnnRewardNet:
    th.manual_seed(0)
    return CnnRewardNet(SPACE, gym.spaces.Discrete(N_ACTIONS)).to(device)


def synchronize(device: th.device) -> None:
    if device.type == "cuda":
        th.cuda.synchronize(device)


def measure(
    step: Callable[[], None],
    device: th.device,
    *,
    steps: int,
    warmup: int,
) -> Tuple[float, Optional[int]]:
    """Median seconds per step after ``warmup`` steps, and the peak memory."""
    for _ in range(warmup):
        step()
    synchronize(device)
    if device.type == "cuda":
        th.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    peak = th.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return statistics.median(seconds), peak


# Preference -------------------------------------------------------------------


def preference_dataset(pairs: int, length: int) -> pc.PreferenceDataset:
    rng = np.random.default_rng(0)

    def fragment() -> types.TrajectoryWithRew:
        return types.TrajectoryWithRew(
            obs=rng.integers(0, 256, (length + 1, *FRAME), dtype=np.uint8),
            acts=rng.integers(0, N_ACTIONS, length),
            infos=None,
            terminal=False,
            rews=np.zeros(length, dtype=np.float32),
        )

    dataset = pc.PreferenceDataset()
    dataset.push(
        [(fragment(), fragment()) for _ in range(pairs)],
        rng.uniform(size=pairs).astype(np.float32),
    )
    return dataset


class BarePreferenceLoop:
    """The hand-written preference step over stacked frames.

    Frames of the first and the second fragments are stacked once, pair by pair
    (``(pairs, 2, length, *FRAME)``, uint8), on the device or on the host.
    """

    def __init__(
        self,
        net: th.nn.Module,
        dataset: pc.PreferenceDataset,
        minibatch: int,
        device: th.device,
        *,
        on_device: bool,
    ) -> None:
        where = device if on_device else th.device("cpu")
        frags = list(zip(dataset.fragments1, dataset.fragments2))
        self.obs = th.as_tensor(
            np.stack([[f.obs[:-1] for f in pair] for pair in frags]), device=where
        )
        self.acts = th.as_tensor(
            np.stack([[f.acts for f in pair] for pair in frags]), device=where
        )
        self.prefs = th.as_tensor(dataset.preferences, device=device)
        self.net, self.device, self.minibatch = net, device, minibatch
        self.optim = th.optim.AdamW(net.parameters())

    def step(self) -> None:
        """One step over all pairs, in minibatches."""
        self.optim.zero_grad()
        n_pairs, _, length = self.acts.shape
        for start in range(0, n_pairs, self.minibatch):
            rows = slice(start, start + self.minibatch)
            obs = self.obs[rows].to(self.device).flatten(0, 2).float() / 255.0
            acts = F.one_hot(self.acts[rows].to(self.device).flatten(), N_ACTIONS)
            dones = th.zeros(len(obs), device=self.device)
            rewards = self.net(obs, acts.float(), obs, dones)
            returns = rewards.reshape(-1, 2, length).sum(-1)
            logits = returns[:, 0] - returns[:, 1]
            loss = F.binary_cross_entropy_with_logits(
                logits, self.prefs[rows], reduction="sum"
            )
            (loss / n_pairs).backward()
        self.optim.step()


def preference_step(
    net: th.nn.Module,
    dataset: pc.PreferenceDataset,
    minibatch: int,
    **kwargs: Any,
) -> Callable[[], None]:
    from imitation_accum import CrossEntropyRewardTrainer

    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(0),
        batch_size=len(dataset),
        minibatch_size=minibatch,
        custom_logger=quiet_logger(),
        progress_bar=False,
        **kwargs,
    )
    return lambda: trainer.train(dataset)  # one epoch: one step


def discriminator_step(
    net: th.nn.Module,
    batch: int,
    minibatch: int,
    device: th.device,
    **kwargs: Any,
) -> Callable[[], None]:
    from bench_discriminator import random_transitions

    trainer = make_gail(batch, minibatch, str(device), net, **kwargs)
    rng = np.random.default_rng(0)
    expert, gen = (
        types.dataclass_quick_asdict(random_transitions(rng, batch)) for _ in "eg"
    )
    return lambda: trainer.train_disc(expert_samples=expert, gen_samples=gen)


# The table ---------------------------------------------------------------------


def row_kinds(update: str) -> List[str]:
    kinds = ["bare", "bare_host", "package", *OPTIONS]
    if update == "preference":
        kinds.append("+bf16")
    return [*kinds, "+all"]


def make_step(
    update: str,
    kind: str,
    minibatch: int,
    device: th.device,
    sizes: Dict[str, Any],
    dataset: pc.PreferenceDataset,
    compile_backend: str,
) -> Callable[[], None]:
    net = make_net(device)
    if kind in ("bare", "bare_host"):
        on_device = kind == "bare"
        if update == "preference":
            loop = BarePreferenceLoop(
                net, dataset, minibatch, device, on_device=on_device
            )
            return loop.step
        batch = sizes["disc_batch"]
        return BareLoop(net, batch, minibatch, str(device), on_device=on_device).step
    kwargs: Dict[str, Any] = {}
    options = dict(OPTIONS.get(kind, {}))
    if kind == "+all":
        options = {**ALL, "compile": True}
    if options.get("compile"):
        options["compile_backend"] = compile_backend
    if options:
        kwargs["acceleration"] = options
    if update == "preference":
        if kind in ("+bf16", "+all"):
            kwargs["autocast_dtype"] = "bfloat16"
        return preference_step(net, dataset, minibatch, **kwargs)
    return discriminator_step(net, sizes["disc_batch"], minibatch, device, **kwargs)


def run_table(
    device: th.device,
    sizes: Dict[str, Any],
    *,
    deadline: float,
    compile_backend: str,
) -> List[Dict[str, Any]]:
    dataset = preference_dataset(sizes["pairs"], sizes["length"])
    rows = []
    for update, batch_frames, minibatches in (
        ("preference", 2 * sizes["pairs"] * sizes["length"], sizes["pair_minibatches"]),
        ("discriminator", 2 * sizes["disc_batch"], sizes["disc_minibatches"]),
    ):
        for minibatch in minibatches:
            for kind in row_kinds(update):
                row: Dict[str, Any] = dict(update=update, minibatch=minibatch, row=kind)
                rows.append(row)
                if time.monotonic() > deadline:
                    row["status"] = "not run (time limit)"
                    continue
                started = time.monotonic()
                try:
                    step = make_step(
                        update, kind, minibatch, device, sizes, dataset, compile_backend
                    )
                    seconds, peak = measure(
                        step, device, steps=sizes["steps"], warmup=sizes["warmup"]
                    )
                except Exception as error:  # reported in the table, not hidden
                    row["status"] = f"failed: {type(error).__name__}: {error}"[:200]
                    print(f"{update} {minibatch} {kind}: {row['status']}", flush=True)
                    continue
                row.update(
                    status="ok",
                    seconds_per_step=seconds,
                    frames_per_second=batch_frames / seconds,
                    peak_memory_bytes=peak,
                    wall_seconds=time.monotonic() - started,
                )
                print(
                    f"{update} minibatch {minibatch} {kind}: {1e3 * seconds:.1f} ms, "
                    f"{batch_frames / seconds:.0f} frames/s "
                    f"({row['wall_seconds']:.0f} s)",
                    flush=True,
                )
                if device.type == "cuda":
                    th.cuda.empty_cache()
    return rows


def markdown(rows: List[Dict[str, Any]], sizes: Dict[str, Any], device: str) -> str:
    lines = [
        f"CnnRewardNet on {FRAME[0]}x{FRAME[1]}x{FRAME[2]} uint8 frames, "
        f"{N_ACTIONS} actions. Preference: batch of {sizes['pairs']} pairs of "
        f"{sizes['length']} steps; discriminator (GAIL): {sizes['disc_batch']} expert "
        f"and {sizes['disc_batch']} generator transitions. Median of "
        f"{sizes['steps']} steps after {sizes['warmup']} warm-up step(s).",
        "",
        "| update | minibatch | row | frames/s | ms/step | vs bare | "
        "max_memory_allocated (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    bare = {
        (r["update"], r["minibatch"]): r["seconds_per_step"]
        for r in rows
        if r["row"] == "bare" and r.get("status") == "ok"
    }
    for r in rows:
        if r.get("status") != "ok":
            cells = [r["status"], "", "", ""]
        else:
            base = bare.get((r["update"], r["minibatch"]))
            ratio = f"{base / r['seconds_per_step']:.2f}x" if base else ""
            peak = r["peak_memory_bytes"]
            cells = [
                f"{r['frames_per_second']:.0f}",
                f"{1e3 * r['seconds_per_step']:.1f}",
                ratio,
                "" if peak is None else f"{peak / 2**20:.0f}",
            ]
        lines.append(
            f"| {r['update']} | {r['minibatch']} | {r['row']} | "
            + " | ".join(cells)
            + " |"
        )
    lines.append("")
    lines.append(
        "vs bare: the bare device-resident loop's time per step over the row's "
        "(above 1 is faster)."
    )
    return _results.with_made_by("\n".join(lines), device)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if th.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds")
    parser.add_argument(
        "--time-limit-s",
        type=float,
        default=None,
        help="rows not started by then are listed as not run",
    )
    parser.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend (default: inductor; aot_eager with --quick on CPU)",
    )
    _results.add_out_dir(parser)
    args = parser.parse_args(argv)
    out_dir = _results.resolve_out_dir(args)
    device = th.device(args.device)
    sizes = QUICK if args.quick else FULL
    backend = args.compile_backend or (
        "aot_eager" if args.quick and device.type == "cpu" else "inductor"
    )
    limit = float("inf") if args.time_limit_s is None else args.time_limit_s
    deadline = time.monotonic() + limit
    rows = run_table(device, sizes, deadline=deadline, compile_backend=backend)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(out_dir) / f"gpu_bench_{device.type}"
    table = markdown(rows, sizes, args.device)
    stem.with_suffix(".md").write_text(table)
    stem.with_suffix(".json").write_text(
        json.dumps({"sizes": sizes, "compile_backend": backend, "rows": rows}, indent=1)
    )
    print(table)
    print(f"wrote {stem}.md and .json")
    failed = [r for r in rows if str(r.get("status", "")).startswith("failed")]
    if failed:
        sys.exit(f"{len(failed)} row(s) failed")


if __name__ == "__main__":
    main()
