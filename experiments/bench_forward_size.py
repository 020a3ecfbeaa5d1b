"""The default ``forward_size`` against fixed sizes, seconds per epoch in one run.

For each configuration of ``bench_reward_trainer.py`` (``mlp``, ``cnn84-25``,
``cnn84-100``, ``cnn210``) the trainer trains the same data from the same initial
net with ``forward_size="auto"`` (the default, derived from the memory probe) and
with fixed sizes (the largest is one call per side of a chunk), in one process:
every point warmed up once, then ``--repeats`` rounds in which each point times
one ``train()`` call (in a fresh seeded order each round). The table gives
each point's fastest round in seconds per epoch (a shared machine's intermittent
load only slows a round down) and the default's ratio to the fastest fixed size.
``--busy`` measures every
configuration again with ``bench_reward_trainer.py``'s competing job (a
matrix-multiply loop on every core) running; in both the trainer's calls run at
the intra-op threads of its thread policy (docs/forward_size.md), which follow
each size's calls.

Usage::

    python experiments/bench_forward_size.py --busy        # docs/results/
    python experiments/bench_forward_size.py --quick --out-dir /tmp/fs  # seconds

``--quick`` times the ``mlp`` configuration alone, one round of two epochs (its
figures mean little), into ``output/experiments/`` unless ``--out-dir`` says
otherwise.
"""

import argparse
import copy
import time

import numpy as np
import torch as th

import _results
from bench_reward_trainer import (
    CONFIGS,
    EPOCHS,
    Competitor,
    _results_commit,
    accum_trainer,
    load_average,
    make_data,
    make_net,
    train_epochs,
    write,
)

#: Fixed sizes timed against the default, per configuration kind, besides one
#: call per side of a chunk. An MLP's calls cost their fixed overheads, so small
#: ones are left out (calls of one transition would take minutes).
FIXED_SIZES = {"mlp": (64, 256), "cnn": (2, 4, 8, 16, 32)}


def fixed_sizes(config: str) -> list:
    """The fixed sizes of ``config``: :data:`FIXED_SIZES` and a side's chunk."""
    _, kind, _, length, _, minibatch_size = CONFIGS[config]
    side = minibatch_size * length  # transitions of one side of a chunk
    return sorted({*(s for s in FIXED_SIZES[kind] if s < side), side})


def measure(config: str, repeats: int, epochs: int) -> dict:
    """Fastest seconds per epoch of the default and of each fixed size."""
    shape, kind, n_pairs, length, batch_size, minibatch_size = CONFIGS[config]
    th.manual_seed(0)
    dataset = make_data(shape, n_pairs, length)
    initial = make_net(shape, kind)
    sizes = ["auto", *fixed_sizes(config)]
    trainers = {
        size: accum_trainer(
            copy.deepcopy(initial), batch_size, minibatch_size, forward_size=size
        )
        for size in sizes
    }
    for trainer in trainers.values():
        train_epochs(trainer, dataset, 1)  # warm-up; the probe runs here
    default = trainers["auto"].last_plan.forward_size
    times: dict = {size: [] for size in sizes}
    order = np.random.default_rng(0)
    for _ in range(repeats):
        for size in order.permutation(np.array(sizes, dtype=object)):
            start = time.perf_counter()
            train_epochs(trainers[size], dataset, epochs)
            times[size].append((time.perf_counter() - start) / epochs)
    fastest_rounds = {size: min(values) for size, values in times.items()}
    fastest = min(fixed_sizes(config), key=lambda size: fastest_rounds[size])
    return {
        "fastest_rounds": fastest_rounds,
        "default": default,
        "fastest": fastest,
        "ratio": fastest_rounds["auto"] / fastest_rounds[fastest],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", nargs="*", choices=list(CONFIGS))
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--quick", action="store_true")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)
    configs = args.configs or (["mlp"] if args.quick else list(CONFIGS))
    repeats = 1 if args.quick else args.repeats
    lines = [
        "| config | load | default forward_size | default s/epoch | fixed sizes: "
        "s/epoch | fastest fixed | default / fastest fixed | load average (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for load in ["quiet", "busy"] if args.busy else ["quiet"]:
        for config in configs:
            epochs = 2 if args.quick else EPOCHS[config]
            average = load_average()
            if load == "busy":
                with Competitor():
                    result = measure(config, repeats, epochs)
            else:
                result = measure(config, repeats, epochs)
            fastest_rounds = result["fastest_rounds"]
            fixed = ", ".join(
                f"{size}: {seconds:.4g}"
                for size, seconds in fastest_rounds.items()
                if size != "auto"
            )
            lines.append(
                f"| {config} | {load} | {result['default']} | "
                f"{fastest_rounds['auto']:.4g} | {fixed} | {result['fastest']} | "
                f"{result['ratio']:.2f}x | {average:.2f} |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        f"The fastest of {repeats} interleaved timings per point, each one train() "
        "call of "
        + ", ".join(f"{2 if args.quick else EPOCHS[c]} epoch(s) ({c})" for c in configs)
        + ", all points of a configuration in one process after a one-epoch "
        "warm-up each; default: forward_size='auto' (the memory probe's size); "
        "busy: bench_reward_trainer.py's competing job runs during the "
        "configuration; commit "
        f"{_results_commit()}.",
    ]
    write(out_dir / "bench_forward_size.md", lines)


if __name__ == "__main__":
    main()
