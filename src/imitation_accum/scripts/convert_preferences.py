"""Converts a pickled imitation ``PreferenceDataset`` into a frame store.

``python -m imitation_accum.scripts.convert_preferences IN.pkl OUT``: ``OUT`` becomes
a frame store of the same pairs, which ``train_reward_model`` memory-maps without
unpickling. An existing ``OUT`` is replaced only with ``--overwrite``. Loading
``IN.pkl`` runs any code it holds: convert only files you trust.
"""

import argparse
import os
import pathlib
import sys
from typing import Optional, Sequence

import numpy as np

from imitation_accum.preference.dataset import PreferenceDataset, read_imitation_pickle


def convert(
    source: pathlib.Path, target: pathlib.Path, overwrite: bool = False
) -> PreferenceDataset:
    """Saves the pairs and ``max_size`` of imitation's pickle ``source`` as ``target``.

    Args:
        source: imitation's pickle.
        target: The store's directory.
        overwrite: Replace a store at ``target``; otherwise an existing
            ``target`` is refused before anything is read or written.

    Raises:
        ValueError: naming ``target`` if it exists and ``overwrite`` is false;
            naming ``source`` if it is not a pickled ``PreferenceDataset`` or a
            preference (with its pair's index) is outside ``[0, 1]``.
    """
    if os.path.lexists(target) and not overwrite:
        raise ValueError(
            f"{target} exists; pass --overwrite to replace it (a frame store only)"
        )
    if not source.exists():
        raise ValueError(f"{source}: no such file")
    original = read_imitation_pickle(source, str(source))
    preferences = np.asarray(original.preferences, dtype=np.float32)
    outside = np.flatnonzero(~((preferences >= 0) & (preferences <= 1)))
    if len(outside):
        raise ValueError(
            f"{source}: pair {outside[0]} has preference {preferences[outside[0]]}, "
            f"outside [0, 1] ({len(outside)} of {len(preferences)} pairs are)"
        )
    dataset = PreferenceDataset.of_pairs(original)
    dataset.save(target)
    return dataset


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; see this module's docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m imitation_accum.scripts.convert_preferences",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("source", type=pathlib.Path, help="imitation's pickle (IN.pkl)")
    parser.add_argument("target", type=pathlib.Path, help="the store's directory")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a store at the target"
    )
    args = parser.parse_args(argv)
    try:
        dataset = convert(args.source, args.target, overwrite=args.overwrite)
    except (ValueError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    n_bytes = sum(dataset.nbytes.values())
    print(
        f"{args.target}: {len(dataset)} pairs, {n_bytes / 2**20:.1f} MiB, "
        f"fingerprint {dataset.fingerprint()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
