r"""What ``PreferenceDataset.load(path, verify=True)`` costs, against one epoch.

Builds a store of Atari-sized pairs (84x84x4 uint8 frame stacks of random frames,
as SB3's ``VecFrameStack`` lays them out; random actions and preferences), then
times, with the page cache warm, ``load(path, verify=False)`` (every array but
the frames hashed) and ``load(path, verify=True)`` (the frames too; the default),
median of ``--repeats`` loads each, and one epoch of
``CrossEntropyRewardTrainer`` (imitation's ``CnnRewardNet``, ``batch_size=32``,
``forward_size=20``) on the first ``--epoch-pairs`` pairs of the loaded store,
after one epoch that warms up, scaled to the whole store (an epoch is linear in
its pairs). Frame content changes neither figure.

Usage::

    python experiments/frame_store_verify.py  # docs/results/frame_store_verify.md
    python experiments/frame_store_verify.py --quick --out-dir /tmp/fsv  # meaningless
"""

import argparse
import functools
import pathlib
import statistics
import tempfile
import time
from typing import Optional

import numpy as np
import torch as th

import _results

MIB = 2**20


def make_pairs(
    rng: np.random.Generator,
    n_pairs: int,
    length: int,
    pool: Optional[np.ndarray] = None,
):
    """Pairs of ``length``-step fragments of 84x84x4 frame stacks (own arrays).

    Frames are random, or runs of consecutive frames of ``pool`` (84x84 each).
    """
    from imitation.data import types

    pairs = []
    for _ in range(n_pairs):
        sides = []
        for _ in range(2):
            if pool is None:
                frames = rng.integers(0, 256, (length + 4, 84, 84), dtype=np.uint8)
            else:
                start = int(rng.integers(0, len(pool) - length - 4))
                frames = pool[start : start + length + 4]
            # Observation t: frames t..t+3, oldest first, on the last axis.
            obs = np.stack([frames[t : t + 4] for t in range(length + 1)])
            obs = np.ascontiguousarray(np.moveaxis(obs, 1, -1))
            sides.append(
                types.TrajectoryWithRew(
                    obs=obs,
                    acts=rng.integers(0, 6, length),
                    infos=None,
                    terminal=False,
                    rews=np.zeros(length, np.float32),
                )
            )
        pairs.append((sides[0], sides[1]))
    return pairs, rng.uniform(size=n_pairs).astype(np.float32)


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def epoch_seconds(path: pathlib.Path, n_pairs: int) -> float:
    """Seconds of the second of two one-epoch ``train`` calls on ``n_pairs`` pairs."""
    from gymnasium import spaces
    from imitation.algorithms import preference_comparisons as pc
    from imitation.rewards import reward_nets

    from imitation_accum import CrossEntropyRewardTrainer, PreferenceDataset

    th.manual_seed(0)
    net = reward_nets.CnnRewardNet(
        spaces.Box(0, 255, (84, 84, 4), np.uint8), spaces.Discrete(6)
    )
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(0),
        batch_size=32,
        forward_size=20,
        epochs=1,
        progress_bar=False,
    )
    dataset = th.utils.data.Subset(PreferenceDataset.load(path), range(n_pairs))
    trainer.train(dataset)  # warm-up: the forward-size default, caches
    return timed(lambda: trainer.train(dataset))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--length", type=int, default=25, help="steps per fragment")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epoch-pairs", type=int, default=32, help="pairs trained")
    parser.add_argument("--quick", action="store_true")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)
    if args.quick:
        args.pairs, args.length, args.repeats, args.epoch_pairs = 4, 5, 1, 4

    from imitation_accum import PreferenceDataset
    from imitation_accum.io import frame_store

    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "store"
        dataset = PreferenceDataset()
        dataset.push(*make_pairs(np.random.default_rng(0), args.pairs, args.length))
        dataset.save(path)
        store_mib = sum(f.stat().st_size for f in path.iterdir()) / MIB
        frames_mib = (path / "frames.npy").stat().st_size / MIB
        del dataset
        PreferenceDataset.load(path, verify=True)  # page cache warm
        plain, verified = (
            statistics.median(
                timed(functools.partial(PreferenceDataset.load, path, verify))
                for _ in range(args.repeats)
            )
            for verify in (False, True)
        )
        manifest = frame_store.read_manifest(path)
        # The frames alone, opened with and without their digest checked.
        opened, hashed = (
            statistics.median(
                timed(
                    functools.partial(
                        frame_store.open_array, path, manifest, "frames", verify
                    )
                )
                for _ in range(args.repeats)
            )
            for verify in (False, True)
        )
        epoch_part = epoch_seconds(path, args.epoch_pairs)
    epoch = epoch_part * args.pairs / args.epoch_pairs
    extra = hashed - opened
    text = (
        "# What verifying a frame store costs\n\n"
        f"{args.pairs} pairs of {args.length}-step fragments, 84x84x4 uint8: a store "
        f"of {store_mib:.1f} MiB ({frames_mib:.1f} MiB of frames). Page cache warm, "
        f"median of {args.repeats} loads.\n\n"
        "| | seconds |\n|---|---|\n"
        f"| `load(path, verify=False)` | {plain:.3f} |\n"
        f"| `load(path, verify=True)` (the default) | {verified:.3f} |\n"
        f"| hashing the frames (`open_array` with and without) | {extra:.3f} "
        f"({frames_mib / max(extra, 1e-9):.0f} MiB/s) |\n"
        f"| one training epoch on {args.epoch_pairs} pairs (`CnnRewardNet`, "
        f"`batch_size=32`, `forward_size=20`, CPU) | {epoch_part:.1f} |\n"
        f"| one epoch on all {args.pairs} pairs (scaled) | {epoch:.1f} |\n"
        f"| verifying, as a share of the epoch | {100 * extra / epoch:.2f}% |\n"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "frame_store_verify.md").write_text(_results.with_made_by(text))
    print(text)


if __name__ == "__main__":
    main()
