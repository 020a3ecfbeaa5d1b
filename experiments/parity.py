"""Does the minibatch size change what is learnt? This package vs imitation 1.0.1.

A small synthetic preference task (true reward linear in a 4-dim observation,
fragments of 10 steps, noisy Boltzmann-rational preferences), trained to
convergence with 5 seeds at ``minibatch_size`` in {B, B/4, an uneven size}, with
everything where imitation 1.0.1 drifts turned on: an Lp regularizer with a lambda
updater on a validation split, ``RunningNorm`` input normalization, and a dataset
that leaves a partial last batch every epoch.

Reported per seed: held-out accuracy (on pairs never trained on, labelled by the
true reward) for each minibatch size; for this package also the largest relative
parameter difference from the full-batch run, under SGD (exact up to round-off)
and under AdamW (which turns round-off into full learning-rate steps).
imitation 1.0.1 rejects minibatch sizes that do not divide the batch, so it runs
B and B/4 only.

Usage::

    python experiments/parity.py            # writes docs/results/parity.md
    python experiments/parity.py --quick   # seconds, into output/experiments/

Writes ``parity.md`` to ``--out-dir`` (default ``docs/results/``, the committed
table; with ``--quick``, ``output/experiments/``, which git ignores). ``--quick``
checks that the script runs, in seconds: one seed, two epochs (``--seeds`` and
``--epochs`` override either); its figures mean little.
"""

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data.types import TrajectoryWithRew
from imitation.regularization import regularizers, updaters
from imitation.rewards.reward_nets import BasicRewardNet
from imitation.util import networks

import _results
from _quiet_logger import quiet_logger
from imitation_accum import CrossEntropyRewardTrainer

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)
TRUE_WEIGHTS = np.array([1.0, -2.0, 0.5, 0.0], dtype=np.float32)
BATCH = 32
MINIBATCHES = (BATCH, BATCH // 4, 5)


def make_pairs(rng, n_pairs, length=10):
    def fragment():
        obs = (rng.normal(size=(length + 1, 4)) * [1, 2, 1, 3] + [3, 0, -1, 5]).astype(
            np.float32,
        )
        return TrajectoryWithRew(
            obs=obs,
            acts=rng.integers(0, 2, size=length),
            infos=None,
            terminal=False,
            rews=obs[:-1] @ TRUE_WEIGHTS,
        )

    pairs = [(fragment(), fragment()) for _ in range(n_pairs)]
    returns = np.array([[a.rews.sum(), b.rews.sum()] for a, b in pairs])
    p_first = 1 / (1 + np.exp((returns[:, 1] - returns[:, 0]) / 2.0))
    prefs = (rng.uniform(size=n_pairs) < p_first).astype(np.float32)
    truth = (returns[:, 0] > returns[:, 1]).astype(np.float32)
    return pairs, prefs, truth


def dataset_of(pairs, prefs):
    dataset = pc.PreferenceDataset()
    dataset.push(pairs, prefs)
    return dataset


def held_out_accuracy(net, pairs, truth):
    with th.no_grad(), networks.evaluating(net):
        scores = []
        for a, b in pairs:
            r = [
                net(
                    *net.preprocess(
                        f.obs[:-1], f.acts, f.obs[1:], np.zeros(len(f.acts))
                    )
                )
                .sum()
                .item()
                for f in (a, b)
            ]
            scores.append(float(r[0] > r[1]))
    return float(np.mean(np.array(scores) == truth)), len(truth)


def train(kind, seed, minibatch_size, dataset, epochs, optimizer="adamw"):
    th.manual_seed(seed)
    net = BasicRewardNet(
        OBS_SPACE,
        ACT_SPACE,
        hid_sizes=(32, 32),
        normalize_input_layer=networks.RunningNorm,
    )
    factory = regularizers.LpRegularizer.create(
        initial_lambda=1e-3,
        p=2,
        lambda_updater=updaters.IntervalParamScaler(0.5, (0.9, 1.5)),
        val_split=0.2,
    )
    common = {
        "batch_size": BATCH,
        "minibatch_size": minibatch_size,
        "epochs": epochs,
        "lr": 3e-3 if optimizer == "adamw" else 0.05,
        "custom_logger": quiet_logger(),
        "regularizer_factory": factory,
    }
    model = pc.PreferenceModel(net)
    loss = pc.CrossEntropyRewardLoss()
    rng = np.random.default_rng(seed)
    if kind == "imitation":
        th.manual_seed(seed)  # imitation's DataLoader shuffles with torch's RNG
        trainer = pc.BasicRewardTrainer(model, loss, rng, **common)
    else:
        extra = {"progress_bar": False, "forward_size": 400}
        if optimizer == "sgd":
            extra["optimizer_cls"] = th.optim.SGD
        trainer = CrossEntropyRewardTrainer(model, loss, rng, **common, **extra)
    trainer.train(dataset)
    return net, trainer.regularizer.lambda_


def max_relative_difference(net, reference):
    diffs = [
        float((p - q).detach().norm() / q.detach().norm().clamp(min=1e-12))
        for p, q in zip(net.parameters(), reference.parameters())
    ]
    return max(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seconds, to check it runs: 1 seed, 2 epochs",
    )
    parser.add_argument("--seeds", type=int, help="seeds (default 5; --quick: 1)")
    parser.add_argument("--epochs", type=int, help="epochs (default 40; --quick: 2)")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    _results.resolve_out_dir(args)
    seeds = range(args.seeds or (1 if args.quick else 5))
    epochs = args.epochs or (2 if args.quick else 40)
    data_rng = np.random.default_rng(1234)
    pairs, prefs, _ = make_pairs(data_rng, 250)  # 200 train + 50 val: 6 batches + 8
    test_pairs, _, test_truth = make_pairs(data_rng, 400)
    dataset = dataset_of(pairs, prefs)

    rows = []
    for seed in seeds:
        row = {"seed": seed}
        for kind, sizes in (("accum", MINIBATCHES), ("imitation", MINIBATCHES[:2])):
            nets = {}
            for mb in sizes:
                net, lam = train(kind, seed, mb, dataset, epochs)
                nets[mb] = net
                row[(kind, mb)] = held_out_accuracy(net, test_pairs, test_truth)[0]
                row[(kind, mb, "lambda")] = lam
            row[(kind, "adamw_diff")] = max(
                max_relative_difference(nets[mb], nets[BATCH]) for mb in sizes[1:]
            )
        sgd = {
            mb: train("accum", seed, mb, dataset, epochs, "sgd")[0]
            for mb in MINIBATCHES
        }
        row[("accum", "sgd_diff")] = max(
            max_relative_difference(sgd[mb], sgd[BATCH]) for mb in MINIBATCHES[1:]
        )
        rows.append(row)
        print(row, flush=True)
    write_table(rows, len(test_truth), epochs, args.out_dir)


def write_table(rows, n_test, epochs, out_dir: Path) -> None:
    b, q, u = MINIBATCHES
    lines = [
        f"Held-out accuracy on {n_test} pairs after {epochs} epochs "
        f"(batch {b}; partial last batch of 8; Lp + lambda updater; RunningNorm).",
        "",
        f"| seed | accum mb={b} | accum mb={q} | accum mb={u} | accum max param diff "
        f"(AdamW / SGD) | imitation mb={b} | imitation mb={q} | imitation max param "
        f"diff (AdamW) | lambda accum (mb={b}/{q}/{u}) | lambda imitation "
        f"(mb={b}/{q}) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {r[('accum', b)]:.4f} | {r[('accum', q)]:.4f} "
            f"| {r[('accum', u)]:.4f} "
            f"| {r[('accum', 'adamw_diff')]:.1e} / {r[('accum', 'sgd_diff')]:.1e} "
            f"| {r[('imitation', b)]:.4f} | {r[('imitation', q)]:.4f} "
            f"| {r[('imitation', 'adamw_diff')]:.1e} "
            f"| {r[('accum', b, 'lambda')]:.2e} / {r[('accum', q, 'lambda')]:.2e} / "
            f"{r[('accum', u, 'lambda')]:.2e} "
            f"| {r[('imitation', b, 'lambda')]:.2e} / "
            f"{r[('imitation', q, 'lambda')]:.2e} |",
        )
    path = out_dir / "parity.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_results.with_made_by("\n".join(lines)))
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
