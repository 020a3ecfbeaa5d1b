"""How far does a budget that splits pairs (two passes) move the parameters?

Two passes compute the same update as one pass, up to float round-off: the rewards
are summed into returns in another order. Over many steps, how far apart do the
runs end? Trained from the same initial net on the same batches: one pass over
whole batches (the reference), two passes under a ``memory_budget`` that holds
less than one pair, and, as a control, one pass in minibatches of 3 pairs (the
same update, another round-off). Each under AdamW (imitation's optimizer) and SGD.

Reported: the relative L2 difference of all parameters from the reference,
``||p - p_ref|| / ||p_ref||``, and the largest of it per parameter tensor.

Usage::

    python experiments/two_pass_drift.py           # docs/results/two_pass_drift.md
    python experiments/two_pass_drift.py --quick   # seconds, output/experiments/

``--out-dir DIR`` writes ``two_pass_drift.md`` to ``DIR`` instead.
"""

import argparse
import copy
import time
from typing import Dict, List, Tuple

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data.types import TrajectoryWithRew
from imitation.rewards.reward_nets import BasicRewardNet

import _results
from imitation_accum import CrossEntropyRewardTrainer
from imitation_accum.preference import pair_table

OBS = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
ACTS = gym.spaces.Discrete(4)
FRAGMENT = 25  # transitions per fragment, as the Atari presets
#: Fragment lengths of a pair's two sides: equal (imitation's default), where a
#: constant reward shift has an exactly zero gradient, and unequal, where not.
LENGTHS = {"equal": (FRAGMENT, FRAGMENT), "unequal": (FRAGMENT - 5, FRAGMENT + 5)}
BATCH = 16  # pairs per step


def make_dataset(
    rng: np.random.Generator, n_pairs: int, lengths: Tuple[int, int]
) -> pc.PreferenceDataset:
    """Pairs labelled by a true reward linear in the observation."""
    weights = rng.normal(size=OBS.shape[0])

    def fragment(length: int) -> TrajectoryWithRew:
        obs = rng.normal(size=(length + 1, OBS.shape[0])).astype(np.float32)
        rews = (obs[:-1] @ weights).astype(np.float32)
        acts = rng.integers(0, ACTS.n, length)
        return TrajectoryWithRew(
            obs=obs, acts=acts, infos=None, terminal=False, rews=rews
        )

    pairs = [(fragment(lengths[0]), fragment(lengths[1])) for _ in range(n_pairs)]
    diff = np.array([b.rews.sum() - a.rews.sum() for a, b in pairs])
    prefs = (1 / (1 + np.exp(np.clip(diff, -50, 50)))).astype(np.float32)
    dataset = pc.PreferenceDataset()
    dataset.push(pairs, prefs)
    return dataset


def trainer_for(
    net: BasicRewardNet, optimizer: str, **kwargs: object
) -> CrossEntropyRewardTrainer:
    optimizer_cls = {"AdamW": th.optim.AdamW, "SGD": th.optim.SGD}[optimizer]
    return CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(1),  # the same batches in every run
        batch_size=BATCH,
        lr=1e-3 if optimizer == "AdamW" else 0.05,
        optimizer_cls=optimizer_cls,
        forward_size=10,  # fixed: the default measures nothing, but say so
        progress_bar=False,
        **kwargs,  # type: ignore[arg-type]
    )


def splitting_budget(net: BasicRewardNet, dataset: pc.PreferenceDataset) -> int:
    """A memory budget whose chunks hold 10 transitions: less than one pair."""
    probe = trainer_for(copy.deepcopy(net), "AdamW")
    probe._task.refresh_device()
    profile = probe._profile(pair_table.read_preferences(dataset))
    return int(profile.chunk_bytes(10, 10))


def relative(
    params: List[th.Tensor], reference: List[th.Tensor]
) -> Tuple[float, float]:
    """Relative L2 difference of all parameters, and its largest per tensor."""
    diff = th.cat([(p - r).reshape(-1) for p, r in zip(params, reference)])
    ref = th.cat([r.reshape(-1) for r in reference])
    per_tensor = [
        float(th.linalg.vector_norm(p - r) / th.linalg.vector_norm(r))
        for p, r in zip(params, reference)
    ]
    return float(th.linalg.vector_norm(diff) / th.linalg.vector_norm(ref)), max(
        per_tensor
    )


def run(steps: int, seed: int, lengths: str) -> List[Dict[str, object]]:
    rng = np.random.default_rng(seed)
    # one epoch of `steps` full batches
    dataset = make_dataset(rng, steps * BATCH, LENGTHS[lengths])
    th.manual_seed(seed)
    initial = BasicRewardNet(OBS, ACTS, hid_sizes=(32, 32))
    budget = splitting_budget(initial, dataset)
    rows: List[Dict[str, object]] = []
    for optimizer in ("AdamW", "SGD"):
        finals = {}
        for variant, kwargs in (
            ("one pass, whole batches", {}),
            ("two passes (memory_budget)", {"memory_budget": budget}),
            ("one pass, minibatches of 3", {"minibatch_size": 3}),
        ):
            net = copy.deepcopy(initial)
            trainer = trainer_for(net, optimizer, **kwargs)
            start = time.perf_counter()
            trainer.train(dataset)
            assert trainer.engine.n_steps == steps
            assert trainer.last_plan is not None
            finals[variant] = (
                [p.detach().clone() for p in net.parameters()],
                trainer.last_plan.two_pass,
                time.perf_counter() - start,
            )
        reference = finals["one pass, whole batches"][0]
        for variant, (params, two_pass, seconds) in finals.items():
            total, largest = relative(params, reference)
            rows.append(
                {
                    "lengths": lengths,
                    "optimizer": optimizer,
                    "variant": variant,
                    "two_pass": two_pass,
                    "total": total,
                    "largest": largest,
                    "seconds": seconds,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default 138")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 steps")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: this net's calls are tiny, and two threads "
        "on 2 shared cores ran them 40x slower)",
    )
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)
    th.set_num_threads(args.threads)
    steps = args.steps or (3 if args.quick else 138)
    rows = [row for lengths in LENGTHS for row in run(steps, args.seed, lengths)]
    lines = [
        "# Two passes against one: parameter drift",
        "",
        f"{steps} steps of {BATCH} pairs, fragments of {LENGTHS['equal']} or "
        f"{LENGTHS['unequal']} transitions, BasicRewardNet (32, 32), seed "
        f"{args.seed}; relative L2 difference from the one-pass whole-batch run "
        "(all parameters, and the largest per tensor).",
        "",
        "| lengths | optimizer | variant | two passes | relative difference | "
        "largest per tensor | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['lengths']} | {row['optimizer']} | {row['variant']} | "
            f"{row['two_pass']} | "
            f"{row['total']:.2g} | {row['largest']:.2g} | {row['seconds']:.1f} |"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    text = _results.with_made_by("\n".join(lines))
    (out_dir / "two_pass_drift.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
