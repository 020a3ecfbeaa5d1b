"""The learned reward in the RL loop: per environment step against batched per rollout.

Runs the README's quickstart (``configs/pong_cpu_quickstart.json``: Pong, 8 envs,
PPO rollouts of 128 steps, a ``NormalizedRewardNet(CnnRewardNet)``) end to end,
as the README gives it, in pairs of runs in one process, one pair per seed (the
order within a pair alternating, so load from other jobs falls on both paths):
with ``batched_rollout_reward=False`` (imitation's path: one reward-net call of 8
frames per environment step, and ``AgentTrainer.sample``'s extra rollouts
rewarded too) and with the default ``True``. Timers around SB3's
``collect_rollouts`` and the learned-reward computation give the reward's share
of rollout time and its cost per frame; the runs' results (the reward model's
last accuracy and loss, the final policy's return) show whether the paths'
outcomes stay within the seed-to-seed spread.

Usage::

    python experiments/bench_rollout_reward.py --seeds 3
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
from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np
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


def run_once(batched: bool, quick: bool, seed: int) -> Dict[str, float]:
    """One whole run; its wall time, timers and the load average around it."""
    updates: Dict[str, Any] = {} if quick else dict(load_config_file(str(QUICKSTART)))
    timers = Timers()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as log_dir:
        updates.update(
            {
                "seed": seed,
                rollout_reward.CONFIG_KEY: batched,
                "logging": {"log_dir": log_dir},
            }
        )
        start = time.perf_counter()
        with timed(timers, batched):
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
    step = [r for name, r in runs if name.startswith("per step")]
    batch = [r for name, r in runs if name.startswith("batched")]

    def median_ratio(ratio: Callable[[Dict[str, float], Dict[str, float]], float]):
        return float(np.median([ratio(a, b) for a, b in zip(step, batch)]))

    def spread(path: List[Dict[str, float]], key: str) -> str:
        values = [r[key] for r in path]
        return f"{_f(min(values))} to {_f(max(values))}"

    whole = median_ratio(lambda a, b: a["wall_s"] / b["wall_s"])
    share = median_ratio(
        lambda a, b: (b["reward_s"] / b["rollout_s"]) / (a["reward_s"] / a["rollout_s"])
    )
    per_frame = median_ratio(
        lambda a, b: (a["reward_s"] / a["frames"]) / (b["reward_s"] / b["frames"])
    )
    lines += [
        "",
        f"Medians over the {len(step)} pairs (each pair's ratio, same seed): whole "
        f"run, per step / batched: {whole:.2f}x. Learned reward's share of rollout "
        f"time, batched / per step: {share:.2f}. Cost per frame in rollouts, per "
        f"step / batched: {per_frame:.2f}x.",
        "",
        "Across the seeds, per step / batched: final reward accuracy "
        f"{spread(step, 'reward_accuracy')} / {spread(batch, 'reward_accuracy')}; "
        f"final reward loss {spread(step, 'reward_loss')} / "
        f"{spread(batch, 'reward_loss')}; policy return "
        f"{spread(step, 'policy_return')} / {spread(batch, 'policy_return')}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="imitation's fast CartPole run"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="pairs of runs, one per seed from 0 (default 3)",
    )
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)
    run_once(batched=True, quick=True, seed=0)  # warm-up: imports, first calls
    runs: List[Tuple[str, Dict[str, float]]] = []
    for seed in range(args.seeds):
        for batched in (False, True) if seed % 2 == 0 else (True, False):
            name = f"{'batched' if batched else 'per step'}, seed {seed}"
            runs.append((name, run_once(batched, args.quick, seed)))
    what = (
        "imitation's CartPole experiment with `fast`"
        if args.quick
        else "The quickstart (`configs/pong_cpu_quickstart.json`)"
    )
    text = (
        "# The learned reward in rollouts: per step against batched\n\n"
        f"{what} end to end after a short warm-up run, in {args.seeds} pairs of "
        "runs in one process, one pair per seed, the order within a pair "
        "alternating. The final reward accuracy and loss are the reward model's "
        "last training; the policy return is imitation's evaluation of the final "
        "policy (the environment's reward). The machine may be shared with other "
        "jobs (load average in the table). No GPU: CPU only.\n\n" + table(runs)
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_rollout_reward.md"
    path.write_text(_results.with_made_by(text))
    print(path.read_text())


if __name__ == "__main__":
    main()
