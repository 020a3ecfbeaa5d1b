"""The learned reward in the RL loop: per environment step against batched per rollout.

Runs the README's quickstart (``configs/pong_cpu_quickstart.json``: Pong, 8 envs,
PPO rollouts of 128 steps, a ``NormalizedRewardNet(CnnRewardNet)``) end to end,
in pairs of runs in one process from the same seed (``--repeats``, the order
within a pair alternating, so load from other jobs falls on both paths): with
``batched_rollout_reward=False`` (imitation's path: one reward-net call of 8
frames per environment step, and ``AgentTrainer.sample``'s extra rollouts
rewarded too) and with the default ``True``. Timers around SB3's
``collect_rollouts`` and the learned-reward computation give the reward's share
of rollout time and its cost per frame.

By default the quickstart is shortened: its first reward-model training runs one
epoch instead of the quickstart's 4 (``initial_epoch_multiplier``). Reward-model
training is the same on both paths, so this shortens the run, not the difference
between the paths; the whole-run ratio of the full quickstart is smaller.
``--full`` runs it as the README gives it.

Usage::

    python experiments/bench_rollout_reward.py
    python experiments/bench_rollout_reward.py --full --repeats 1
    python experiments/bench_rollout_reward.py --quick --out-dir /tmp/bench

Writes ``bench_rollout_reward.md`` to ``--out-dir`` (default ``docs/results/``;
with ``--quick``, ``output/experiments/``). ``--quick`` runs imitation's CartPole
experiment with the ``fast`` named config instead: it checks the script works.
"""

import argparse
import contextlib
import os
import tempfile
import time
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards import reward_nets
from sacred.config import load_config_file
from stable_baselines3.common import on_policy_algorithm

import _results
from imitation_accum.integrations import rollout_reward
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex as ex,
)

QUICKSTART = _results.REPO_ROOT / "configs" / "pong_cpu_quickstart.json"


class Timers:
    """Seconds and frames: rollouts, and the learned reward inside and outside them."""

    def __init__(self) -> None:
        self.figures: Dict[str, float] = dict.fromkeys(
            ("rollout_s", "reward_s", "frames", "other_reward_s", "other_frames"), 0.0
        )
        self.in_rollout = False

    def add_reward(self, seconds: float, frames: int) -> None:
        """Adds one computation of the learned reward."""
        prefix = "" if self.in_rollout else "other_"
        self.figures[prefix + "reward_s"] += seconds
        self.figures[prefix + "frames"] += frames


@contextlib.contextmanager
def timed(timers: Timers, batched: bool) -> Iterator[None]:
    """Timers around ``collect_rollouts`` and the learned reward's path."""
    collect = on_policy_algorithm.OnPolicyAlgorithm.collect_rollouts
    per_step = reward_nets.NormalizedRewardNet.predict_processed
    rollout_rewards = rollout_reward._rollout_rewards

    def timed_collect(self: Any, *args: Any, **kwargs: Any) -> bool:
        start = time.perf_counter()
        timers.in_rollout = True
        try:
            return collect(self, *args, **kwargs)
        finally:
            timers.in_rollout = False
            timers.figures["rollout_s"] += time.perf_counter() - start

    def timed_per_step(self: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        rews = per_step(self, state, *args, **kwargs)
        timers.add_reward(time.perf_counter() - start, len(state))
        return rews

    def timed_batched(net: Any, steps: Any, call_size: int) -> Any:
        start = time.perf_counter()
        rews = rollout_rewards(net, steps, call_size)
        timers.add_reward(time.perf_counter() - start, sum(len(s.dones) for s in steps))
        return rews

    on_policy_algorithm.OnPolicyAlgorithm.collect_rollouts = timed_collect  # type: ignore[method-assign]
    if batched:
        rollout_reward._rollout_rewards = timed_batched
    else:  # not in the batched run: its check compares this attribute
        reward_nets.NormalizedRewardNet.predict_processed = timed_per_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        on_policy_algorithm.OnPolicyAlgorithm.collect_rollouts = collect  # type: ignore[method-assign]
        rollout_reward._rollout_rewards = rollout_rewards
        reward_nets.NormalizedRewardNet.predict_processed = per_step  # type: ignore[method-assign]


@contextlib.contextmanager
def initial_epochs(multiplier: int) -> Iterator[None]:
    """``PreferenceComparisons``' ``initial_epoch_multiplier`` (no config key)."""
    init = pc.PreferenceComparisons.__init__

    def shortened(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "initial_epoch_multiplier": multiplier})

    pc.PreferenceComparisons.__init__ = shortened  # type: ignore[method-assign]
    try:
        yield
    finally:
        pc.PreferenceComparisons.__init__ = init  # type: ignore[method-assign]


def run_once(batched: bool, quick: bool, full: bool = False) -> Dict[str, float]:
    """One whole run; its wall time, timers and the load average around it."""
    updates: Dict[str, Any] = {} if quick else dict(load_config_file(str(QUICKSTART)))
    timers = Timers()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as log_dir:
        updates.update(
            {
                "seed": 0,
                rollout_reward.CONFIG_KEY: batched,
                "logging": {"log_dir": log_dir},
            }
        )
        start = time.perf_counter()
        with timed(timers, batched), contextlib.ExitStack() as stack:
            if not full:
                stack.enter_context(initial_epochs(1))
            run = ex.run(
                config_updates=updates,
                named_configs=["fast"] if quick else [],
                options={"--loglevel": "ERROR"},
            )
        wall = time.perf_counter() - start
    result = run.result or {}
    policy = result.get("imit_stats", {})
    return {
        "wall_s": wall,
        **timers.figures,
        "reward_accuracy": float(result.get("reward_accuracy", float("nan"))),
        "reward_loss": float(result.get("reward_loss", float("nan"))),
        "policy_return": float(policy.get("monitor_return_mean", float("nan"))),
        "load": (load_before + os.getloadavg()[0]) / 2,
    }


def _f(value: float) -> str:
    return f"{value:.4g}"


def _row(name: str, r: Dict[str, float]) -> str:
    share = r["reward_s"] / r["rollout_s"] if r["rollout_s"] else 0.0
    per_frame = 1e3 * r["reward_s"] / r["frames"] if r["frames"] else 0.0
    return (
        f"| {name} | {_f(r['wall_s'])} | {_f(r['rollout_s'])} | "
        f"{_f(r['reward_s'])} | {share:.3f} | {int(r['frames'])} | "
        f"{_f(per_frame)} | {_f(r['other_reward_s'])} "
        f"({int(r['other_frames'])}) | {r['reward_accuracy']:.4f} | "
        f"{r['reward_loss']:.4f} | {_f(r['policy_return'])} | {r['load']:.1f} |"
    )


def table(runs: List[Tuple[str, Dict[str, float]]]) -> str:
    """The Markdown table: one row per run in run order, then the paired ratios."""
    header = [
        "run",
        "wall s",
        "rollouts s",
        "learned reward in rollouts s",
        "share of rollout time",
        "frames rewarded in rollouts",
        "ms per frame",
        "learned reward outside rollouts s (frames)",
        "final reward accuracy",
        "final reward loss",
        "policy return (environment's reward)",
        "load average",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [_row(name, r) for name, r in runs]
    pairs = list(
        zip(
            [r for name, r in runs if name.startswith("per step")],
            [r for name, r in runs if name.startswith("batched")],
        )
    )

    def median(values: List[float]) -> float:
        return float(np.median(values))

    whole = median([step["wall_s"] / batch["wall_s"] for step, batch in pairs])
    share = median(
        [
            (batch["reward_s"] / batch["rollout_s"])
            / (step["reward_s"] / step["rollout_s"])
            for step, batch in pairs
        ]
    )
    per_frame = median(
        [
            (step["reward_s"] / step["frames"]) / (batch["reward_s"] / batch["frames"])
            for step, batch in pairs
        ]
    )
    lines += [
        "",
        f"Medians over the {len(pairs)} pairs (each pair's ratio): whole run, per "
        f"step / batched: {whole:.2f}x. Learned reward's share of rollout time, "
        f"batched / per step: {share:.2f}. Cost per frame in rollouts, per step / "
        f"batched: {per_frame:.2f}x.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="imitation's fast CartPole run"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="the whole quickstart (its first reward-model training not shortened)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="pairs of runs; the order within a pair alternates (default 3)",
    )
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)
    run_once(batched=True, quick=True)  # warm-up: imports and first calls
    runs: List[Tuple[str, Dict[str, float]]] = []
    for repeat in range(args.repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        for batched in order:
            name = f"{'batched' if batched else 'per step'} {repeat + 1}"
            runs.append(
                (name, run_once(batched=batched, quick=args.quick, full=args.full))
            )
    what = (
        "imitation's CartPole experiment with `fast`"
        if args.quick
        else "The quickstart (`configs/pong_cpu_quickstart.json`)"
        + ("" if args.full else ", its first reward training shortened to 1 epoch,")
    )
    text = (
        "# The learned reward in rollouts: per step against batched\n\n"
        f"{what} end to end, from seed 0 after a short warm-up run, in "
        f"{args.repeats} pairs of runs in one process, the order within a pair "
        "alternating. The final reward accuracy and loss are the reward model's "
        "last training; the policy return is imitation's evaluation of the final "
        "policy. The machine may be shared with other jobs (load average in the "
        "table). No GPU: CPU only.\n\n" + table(runs)
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_rollout_reward.md"
    path.write_text(_results.with_made_by(text))
    print(path.read_text())


if __name__ == "__main__":
    main()
