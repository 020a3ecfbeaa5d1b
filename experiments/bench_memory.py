"""Peak memory of reward-model training on 210x160x3 frames: chunks and budgets.

imitation's ``CnnRewardNet`` (32, 32 channels, 3x3 convolutions at full
resolution) trains on random uint8 frames of Atari's raw size. Every point runs in
a fresh process and reports:

- peak memory: on a CPU the peak resident set size minus the resident set size
  just before ``train()`` (``/proc/self/clear_refs`` resets the peak); on CUDA
  ``torch.cuda.max_memory_allocated`` (everything PyTorch holds: parameters,
  gradients, optimizer state, activations). The *train peak* covers the whole
  ``train()`` call (the probe and every step); the *step peak* the optimizer
  steps alone (the peak is reset as
  each step starts, against the same baseline);
- the probe's estimate for the step's largest chunk (``memory_estimate_mib``), at
  the call size the steps ran;
- seconds per optimizer step (the median of the steps after the first).

Series:

- ``minibatch``: one pass, ``minibatch_size`` = 1, 2, 4 pairs (calls of 8
  transitions): peak activation memory against chunk size (linear);
- ``budget``: ``memory_budget`` = 512MiB ... 4GiB, ``forward_size="auto"``: the
  measured peak must stay within the budget;
- ``time``: one pass against two passes at the same chunk size (one call per
  chunk), and with calls of a few transitions, and the default forward size.

``--issue-506`` adds imitation issue #506's case at its real size: 30 pairs of two
100-frame fragments of 210x160x3 frames in one batch, one optimizer step under
``memory_budget="4GiB"``: the probe's estimate for the whole batch in one chunk,
and the measured peak (minutes on a small CPU).

Usage::

    python experiments/bench_memory.py                  # CPU, all series
    python experiments/bench_memory.py --fewer-points   # fewer points
    python experiments/bench_memory.py --issue-506      # + the real-size case
    python experiments/bench_memory.py --series= --issue-506  # that case alone
    python experiments/bench_memory.py --device cuda    # CUDA figures
    python experiments/bench_memory.py --quick --out-dir /tmp/memory  # seconds

Writes ``memory[_cuda].{md,json,png}`` to ``--out-dir`` (default
``docs/results/``, the committed figures; with ``--quick``,
``output/experiments/``, which git ignores; ``--out STEM`` to name the files).
``--quick`` checks that the script runs, in seconds: five points (two minibatch
sizes, one budget, two passes, the default forward size) of 2 pairs of 2-frame
fragments (unless ``--batch-pairs`` or ``--fragment-length`` say otherwise), two
steps each; its figures mean little, and ``--check`` leaves out its time target.
With ``--issue-506``, ``--quick`` runs that point at the quick sizes.
``--fewer-points`` keeps the sizes and leaves out some minibatch sizes and
budgets.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data.types import TrajectoryWithRew
from imitation.rewards.reward_nets import CnnRewardNet

import _results
from _quiet_logger import quiet_logger
from imitation_accum import CrossEntropyRewardTrainer
from imitation_accum.planning.budget import parse_budget
from imitation_accum.preference import pair_table

SHAPE = (210, 160, 3)
N_ACTIONS = 6
# --quick: pairs per batch, frames per fragment, steps per point (defaults).
QUICK_SIZES = {"batch_pairs": 2, "fragment_length": 2, "steps": 2}


# Child process: one point ------------------------------------------------------


def make_dataset(n_pairs: int, length: int, seed: int = 0) -> pc.PreferenceDataset:
    rng = np.random.default_rng(seed)

    def fragment() -> TrajectoryWithRew:
        return TrajectoryWithRew(
            obs=rng.integers(0, 256, size=(length + 1, *SHAPE), dtype=np.uint8),
            acts=rng.integers(0, N_ACTIONS, size=length),
            infos=None,
            terminal=False,
            rews=rng.normal(size=length).astype(np.float32),
        )

    dataset = pc.PreferenceDataset()
    pairs = [(fragment(), fragment()) for _ in range(n_pairs)]
    dataset.push(pairs, rng.uniform(size=n_pairs).astype(np.float32))
    return dataset


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class PeakMemory:
    """The peak memory of a block (see the module's docstring)."""

    def __init__(self, device: th.device, base: Optional[int] = None) -> None:
        self.device = device
        self.fixed_base = base
        self.base = 0
        self.peak = 0

    def _current_peak(self) -> int:
        if self.device.type == "cuda":
            th.cuda.synchronize(self.device)
            return th.cuda.max_memory_allocated(self.device) - self.base
        return _status("VmHWM:") - self.base

    def observe(self) -> None:
        """Keeps the peak so far: a nested block is about to reset it."""
        self.peak = max(self.peak, self._current_peak())

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            th.cuda.synchronize(self.device)
            th.cuda.reset_peak_memory_stats(self.device)
        else:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # peak RSS := current RSS
            self.base = _status("VmRSS:")
        if self.fixed_base is not None:
            self.base = self.fixed_base
        return self

    def __exit__(self, *exc: object) -> None:
        self.observe()


def run_point(spec: Dict[str, Any]) -> Dict[str, Any]:
    device = th.device(spec["device"])
    th.manual_seed(0)
    space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
    net = CnnRewardNet(space, gym.spaces.Discrete(N_ACTIONS)).to(device)
    batch = spec["batch_pairs"]
    dataset = make_dataset(batch * spec["steps"], spec["length"])
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(0),
        batch_size=batch,
        custom_logger=quiet_logger(),
        progress_bar=False,
        **spec["trainer"],
    )
    step = trainer.engine.step
    step_seconds: List[float] = []
    step_peaks: List[int] = []
    train_peak = PeakMemory(device)

    def measured_step(*args: Any, **kwargs: Any) -> Any:
        train_peak.observe()
        with PeakMemory(device, base=train_peak.base) as peak:
            result = step(*args, **kwargs)
        step_seconds.append(result.seconds)
        step_peaks.append(peak.peak)
        return result

    trainer.engine.step = measured_step  # type: ignore[method-assign]
    start = time.perf_counter()
    with train_peak:
        trainer.train(dataset)
    seconds = time.perf_counter() - start
    figures = {
        k.rsplit("/", 1)[-1]: v
        for k, v in trainer.logger.name_to_value.items()
        if k.startswith("reward/final/train/")
    }
    profile = trainer.memory_profile
    if profile is None:  # no budget: probe now, for the estimate
        profile = trainer._profile(pair_table.read_preferences(dataset))
    largest = int(figures["chunk_transitions"])
    forward_size = int(figures["forward_size"])
    whole = 2 * batch * spec["length"]
    return {
        **spec,
        "peak_bytes": max(step_peaks),
        "step_peaks": step_peaks,
        "train_peak_bytes": train_peak.peak,
        "estimate_bytes": profile.chunk_bytes(largest, min(forward_size, largest)),
        "whole_batch_estimate_bytes": profile.chunk_bytes(whole, whole),
        "saved_per_transition": profile.saved_per_transition,
        "chunk_transitions": largest,
        "forward_size": forward_size,
        "two_pass": bool(figures["two_pass"]),
        "minibatches": int(figures["chunks_per_step"]),
        "step_seconds": step_seconds,
        "train_seconds": seconds,
        "loss": figures["loss"],
        "threads": th.get_num_threads(),
    }


# Parent process: the series ------------------------------------------------------


def points(args: argparse.Namespace) -> List[Dict[str, Any]]:
    base = {
        "device": args.device,
        "batch_pairs": args.batch_pairs,
        "length": args.fragment_length,
        "steps": QUICK_SIZES["steps"] if args.quick else 3,
    }
    pair = 2 * args.fragment_length
    fewer = args.fewer_points or args.quick
    minibatches = [1, 2] if fewer else [1, 2, 4]
    budgets = ["1GiB", "2GiB"] if fewer else ["512MiB", "1GiB", "2GiB", "4GiB"]
    if args.device == "cuda":
        budgets = ["1GiB", "2GiB", "4GiB", "8GiB"]
    if args.quick:
        budgets = budgets[:1]
    series: List[Dict[str, Any]] = []
    for k in minibatches:
        series.append(
            {
                **base,
                "series": "minibatch",
                "label": f"minibatch_size={k}",
                "trainer": {"minibatch_size": k, "forward_size": 8, "two_pass": False},
            }
        )
    for budget in budgets:
        series.append(
            {
                **base,
                "series": "budget",
                "label": f"memory_budget={budget}",
                "budget_bytes": parse_budget(budget),
                "trainer": {"memory_budget": budget},
            }
        )
    timing = [(pair, "same chunk, one call per chunk"), (4, "calls of 4")]
    if args.quick:
        timing = timing[:1]
    # --quick: minibatch_size=1 is the one-pass point of the same chunk.
    for size, what in timing:
        for two_pass in (True,) if args.quick else (False, True):
            series.append(
                {
                    **base,
                    "series": "time",
                    "label": f"{'two' if two_pass else 'one'} pass, {what}",
                    "group": what,
                    "trainer": {
                        "minibatch_size": None if two_pass else 1,
                        "forward_size": size,
                        "two_pass": two_pass,
                    },
                }
            )
    series.append(
        {
            **base,
            "series": "time",
            "label": "default (forward_size='auto')",
            "group": "auto",
            "trainer": {"minibatch_size": 1},
        }
    )
    return series


def run_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--point", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{spec['label']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def step_time(result: Dict[str, Any]) -> float:
    """Median seconds of the steps after the first (all, if there is one)."""
    seconds = result["step_seconds"]
    return float(np.median(seconds[1:] if len(seconds) > 1 else seconds))


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f}"


def linear_fit(xs: List[float], ys: List[float]) -> Dict[str, float]:
    slope, intercept = np.polyfit(xs, ys, 1)
    predicted = np.polyval([slope, intercept], xs)
    spread = float(np.sum((np.asarray(ys) - np.mean(ys)) ** 2)) or 1.0
    r2 = 1 - float(np.sum((np.asarray(ys) - predicted) ** 2)) / spread
    return {"slope": float(slope), "intercept": float(intercept), "r2": r2}


def summary(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The targets' figures: linearity, budgets kept, estimate ratio, time ratios."""
    mini = [r for r in results if r["series"] == "minibatch"]
    fit = None
    if len(mini) > 1:
        fit = linear_fit(
            [r["chunk_transitions"] for r in mini], [r["peak_bytes"] for r in mini]
        )
    budgeted = [r for r in results if "budget_bytes" in r]
    ratios = [r["peak_bytes"] / r["estimate_bytes"] for r in results]
    times = {r["label"]: step_time(r) for r in results if r["series"] == "time"}
    time_ratios = {
        group: times[f"two pass, {group}"] / times[f"one pass, {group}"]
        for group in ("same chunk, one call per chunk", "calls of 4")
        if f"one pass, {group}" in times
    }
    return {
        "fit": fit,
        "saved_per_transition": results[0]["saved_per_transition"],
        "budgets_kept": [r["train_peak_bytes"] <= r["budget_bytes"] for r in budgeted],
        "peak_over_estimate": (min(ratios), max(ratios)),
        "time_ratios": time_ratios,
    }


def report(results: List[Dict[str, Any]], args: argparse.Namespace) -> str:
    what = ", CUDA allocated" if args.device == "cuda" else ", RSS added"
    # The series' batch; imitation #506's point names its own below.
    batch = (
        ""
        if all(r["series"] == "issue-506" for r in results)
        else f"{args.batch_pairs} pairs of two {args.fragment_length}-frame "
        "fragments per batch, "
    )
    lines = [
        f"CnnRewardNet on {SHAPE[0]}x{SHAPE[1]}x{SHAPE[2]} frames, {batch}"
        f"device {args.device}, {results[0]['threads']} threads.",
        "",
        f"| point | chunk (transitions) | call size | two-pass | step peak (GiB{what})"
        f" | step estimate (GiB) | train peak (GiB{what}) | budget (GiB) | s/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        budget = gib(r["budget_bytes"]) if "budget_bytes" in r else ""
        lines.append(
            f"| {r['label']} | {r['chunk_transitions']} | {r['forward_size']} | "
            f"{'yes' if r['two_pass'] else 'no'} | {gib(r['peak_bytes'])} | "
            f"{gib(r['estimate_bytes'])} | {gib(r['train_peak_bytes'])} | {budget} "
            f"| {step_time(r):.2f} |"
        )
    figures = summary(results)
    fit, kept = figures["fit"], figures["budgets_kept"]
    low, high = figures["peak_over_estimate"]
    lines.append("")
    if fit is not None:
        lines.append(
            f"- Step peak against chunk size (one pass): {fit['slope'] / 2**20:.2f} "
            f"MiB per transition (autograd saves "
            f"{figures['saved_per_transition'] / 2**20:.2f}), R^2 = {fit['r2']:.4f}."
        )
    lines += [
        f"- Budget points whose train peak is within the budget: {sum(kept)} of "
        f"{len(kept)}.",
        f"- Step peak / step estimate: {low:.2f} to {high:.2f} (at most 1: the "
        "estimate is conservative).",
    ]
    for group, ratio in figures["time_ratios"].items():
        lines.append(f"- Two-pass / one-pass step time, {group}: {ratio:.2f}.")
    for auto in (r for r in results if r.get("group") == "auto"):
        lines.append(
            "- The default, forward_size='auto': "
            f"{'two passes' if auto['two_pass'] else 'one pass'}, calls of "
            f"{auto['forward_size']}, {step_time(auto):.2f} s/step."
        )
    for r in results:
        if r["series"] == "issue-506":
            lines += [
                "",
                f"imitation #506's batch ({r['batch_pairs']} pairs x 2 x "
                f"{r['length']} frames, one batch): the probe estimates "
                f"{gib(r['whole_batch_estimate_bytes'])} GiB for the whole batch in "
                f"one chunk; with memory_budget='4GiB' one optimizer step took "
                f"{step_time(r):.0f} s ({r['minibatches']} chunks of "
                f"{r['chunk_transitions']} transitions, two passes: "
                f"{r['two_pass']}), train() {r['train_seconds']:.0f} s; peak "
                f"{gib(r['train_peak_bytes'])} GiB over the whole train() call, "
                f"{gib(r['peak_bytes'])} GiB in the step.",
            ]
    return "\n".join(lines) + "\n"


# imitation #506's batch: 30 pairs of two 100-frame fragments (6,000 transitions).
ISSUE_506_TRANSITIONS = 30 * 2 * 100


def issue_506_points(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The batch of imitation #506 for the plot: measured if run, else computed.

    With the ``issue-506`` point run, its probe's estimate for the whole batch in
    one chunk and its measured step peak under the budget; without it, the bytes
    autograd saves per transition (the minibatch series' probe) times the batch's
    6,000 transitions.
    """
    runs = [r for r in results if r["series"] == "issue-506"]
    if runs:
        run = runs[0]
        return [
            {
                "x": ISSUE_506_TRANSITIONS,
                "bytes": run["whole_batch_estimate_bytes"],
                "label": "#506's batch in one chunk (probe estimate)",
            },
            {
                "x": run["chunk_transitions"],
                "bytes": run["peak_bytes"],
                "label": "#506's batch, memory_budget=4GiB (measured step peak)",
            },
        ]
    saved = results[0]["saved_per_transition"]
    return [
        {
            "x": ISSUE_506_TRANSITIONS,
            "bytes": saved * ISSUE_506_TRANSITIONS,
            "label": "#506's batch in one chunk (computed: saved bytes x 6,000)",
        }
    ]


def plot(results: List[Dict[str, Any]], path: Path, device: str, made_by: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    what = " (CUDA allocated)" if device == "cuda" else " (RSS added)"
    mini = [r for r in results if r["series"] == "minibatch"]
    budget = [r for r in results if r["series"] == "budget"]
    if not mini or not budget:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    xs = [r["chunk_transitions"] for r in mini]
    left.plot(xs, [r["peak_bytes"] / 2**30 for r in mini], "o-", label="measured")
    estimates = [r["estimate_bytes"] / 2**30 for r in mini]
    left.plot(xs, estimates, "s--", label="estimate")
    for r, x in zip(mini, xs):
        left.annotate(
            f"minibatch_size={r['trainer']['minibatch_size']}",
            (x, r["peak_bytes"] / 2**30),
            textcoords="offset points",
            xytext=(4, -12),
            fontsize=7,
        )
    for point, marker in zip(issue_506_points(results), ("*", "D")):
        left.plot(
            point["x"],
            point["bytes"] / 2**30,
            marker,
            markersize=9,
            label=point["label"],
        )
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("chunk (transitions), one pass; log scale")
    left.set_ylabel("step peak GiB" + what)
    left.set_title(
        f"Peak memory against minibatch_size ({mini[0]['length']}-frame fragments)",
        fontsize=10,
    )
    left.legend(fontsize=7)
    bx = [r["budget_bytes"] / 2**30 for r in budget]
    peaks = [r["train_peak_bytes"] / 2**30 for r in budget]
    right.plot(bx, peaks, "o-", label="measured, whole train() call")
    right.plot(bx, bx, ":", color="gray", label="budget")
    right.set_xlabel("memory_budget (GiB)")
    right.set_ylabel("peak GiB" + what)
    right.set_title("Peak memory against memory_budget", fontsize=10)
    right.legend(fontsize=7)
    fig.text(0.005, 0.005, made_by.replace("`", ""), fontsize=5, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110, metadata={"Description": made_by})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--fewer-points", action="store_true", help="fewer points")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds, to check it runs: fewer, smaller points (see the docstring)",
    )
    parser.add_argument("--issue-506", action="store_true", help="the real-size case")
    parser.add_argument(
        "--batch-pairs",
        type=int,
        help=f"default 4 (--quick: {QUICK_SIZES['batch_pairs']})",
    )
    parser.add_argument(
        "--fragment-length",
        type=int,
        help=f"default 25 (--quick: {QUICK_SIZES['fragment_length']})",
    )
    _results.add_out_dir(parser)
    parser.add_argument(
        "--out", type=Path, default=None, help="output stem (default OUT_DIR/memory)"
    )
    parser.add_argument(
        "--series",
        default="minibatch,budget,time",
        help="comma-separated series to run (minibatch, budget, time)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless the targets hold (budgets kept, estimate conservative, "
        "linear peak, two-pass at most 1.5x one pass at the same chunk, the last "
        "not with --quick)",
    )
    args = parser.parse_args()
    _results.resolve_out_dir(args)
    if args.batch_pairs is None:
        args.batch_pairs = QUICK_SIZES["batch_pairs"] if args.quick else 4
    if args.fragment_length is None:
        args.fragment_length = QUICK_SIZES["fragment_length"] if args.quick else 25
    if args.point:
        print(json.dumps(run_point(json.loads(args.point))))
        return
    wanted = set(args.series.split(",")) if args.series else set()
    specs = [spec for spec in points(args) if spec["series"] in wanted]
    if args.issue_506:
        # --quick: the same point at the quick sizes, to check that it runs.
        pairs, length = (
            (args.batch_pairs, args.fragment_length) if args.quick else (30, 100)
        )
        specs.append(
            {
                "device": args.device,
                "batch_pairs": pairs,
                "length": length,
                "steps": 1,
                "series": "issue-506",
                "label": f"imitation #506: {pairs} pairs x 2 x {length} frames, "
                "budget 4GiB",
                "budget_bytes": 4 * 2**30,
                "trainer": {"memory_budget": "4GiB"},
            }
        )
    results = []
    for spec in specs:
        result = run_child(spec)
        print(
            f"{spec['label']}: step peak {gib(result['peak_bytes'])} GiB, estimate "
            f"{gib(result['estimate_bytes'])} GiB, train peak "
            f"{gib(result['train_peak_bytes'])} GiB, {step_time(result):.2f} s/step",
            flush=True,
        )
        results.append(result)
    name = "memory" if args.device == "cpu" else "memory_cuda"
    stem = args.out or args.out_dir / name
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = report(results, args)
    made_by = _results.made_by(args.device)
    stem.with_suffix(".md").write_text(_results.with_made_by(text, args.device))
    stem.with_suffix(".json").write_text(
        json.dumps({"made_by": made_by, "results": results}, indent=1)
    )
    plot(results, stem.with_suffix(".png"), args.device, made_by)
    print(text)
    print(f"wrote {stem}.{{md,json,png}}")
    if args.check:
        figures = summary(results)
        failures = []
        if not all(figures["budgets_kept"]):
            failures.append("a train peak exceeded its memory_budget")
        if figures["peak_over_estimate"][1] > 1:
            failures.append("a step peak exceeded its estimate")
        if figures["fit"] is not None and figures["fit"]["r2"] < 0.98:
            failures.append("peak memory is not linear in the chunk size")
        two_over_one = figures["time_ratios"].get("same chunk, one call per chunk", 0)
        if args.quick:
            print("--quick: the time target is not checked (tiny points)")
        elif two_over_one > 1.5:
            failures.append("two passes cost more than 1.5x one pass")
        for failure in failures:
            print(f"CHECK FAILED: {failure}", file=sys.stderr)
        if failures:
            sys.exit(1)
        print("CHECKS PASSED")


if __name__ == "__main__":
    main()
