"""A preference dataset's columns as a frame store's arrays, and back.

:class:`~imitation_accum.preference.dataset.PreferenceDataset` keeps its pairs
in :class:`~imitation_accum.preference.row_store.RowStore` columns whose ids
start where the oldest kept row was; a store
(:mod:`imitation_accum.io.frame_store`) holds them as arrays whose ids start at
0. This module converts one way for saving and fingerprints, and opens a store
as read-only, memory-mapped columns for loading.
"""

import pathlib
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from imitation_accum.io import frame_store
from imitation_accum.preference import frame_stacks, store_checks
from imitation_accum.preference.row_store import RowStore

#: The store's arrays, one per column of the dataset.
ARRAYS = (
    "frames",
    "obs_frames",
    "acts",
    "rews",
    "fragments",
    "preferences",
    "infos",  # each fragment's infos, JSON bytes end to end
    "info_spans",  # per fragment: where its infos start in infos, and their size
)

Blocks = Dict[str, Any]
Shapes = Dict[str, Any]
Metadata = Dict[str, Any]


def store_arrays(
    columns: Mapping[str, RowStore],
    layout: frame_stacks.StackLayout,
    *,
    n_pairs: int,
    max_size: Optional[int],
) -> Tuple[Blocks, Shapes, Metadata]:
    """Blocks, shapes and metadata of the store file format (ids from 0).

    Args:
        columns: The dataset's columns, by the names in :data:`ARRAYS`.
        layout: How its observations are split into frames.
        n_pairs: Pairs held.
        max_size: The dataset's bound on pairs (kept in the metadata).

    Returns:
        ``(blocks, shapes, metadata)`` for :func:`frame_store.write_store`.
    """
    fragments = columns["fragments"].to_array()
    if len(fragments):
        # The index's columns: first observation, first transition, length,
        # terminal, first frame, has rewards; the ids shift to start at 0.
        fragments = fragments - np.array(
            [
                columns["obs_frames"].first,
                columns["acts"].first,
                0,
                0,
                columns["frames"].first,
                0,
            ],
        )
    small = {
        "obs_frames": columns["obs_frames"].to_array() - columns["frames"].first,
        "fragments": fragments,
        "info_spans": columns["info_spans"].to_array()
        - np.array([columns["infos"].first, 0]),
    }
    blocks = {
        name: [small[name]] if name in small else columns[name].blocks()
        for name in ARRAYS
    }
    shapes = {
        name: ((len(columns[name]), *columns[name].row_shape), columns[name].dtype)
        for name in ARRAYS
    }
    metadata = {
        "obs_shape": list(layout.obs_shape),
        "channels": layout.channels,
        "n_pairs": n_pairs,
        "max_size": max_size,
    }
    return blocks, shapes, metadata


def open_store(
    directory: pathlib.Path,
    *,
    verify: bool,
) -> Tuple[Mapping[str, Any], frame_stacks.StackLayout, Dict[str, RowStore]]:
    """Opens a store's arrays, checked, as read-only memory-mapped columns.

    Args:
        directory: The store's directory.
        verify: Also check the frames' SHA-256 (reads every frame once).

    Returns:
        ``(manifest, layout, columns)``.

    Raises:
        imitation_accum.io.frame_store.StoreError: naming the file, if the
            store is missing, truncated, corrupt or of another version.
    """
    manifest = frame_store.read_manifest(directory)
    arrays = {
        name: frame_store.open_array(
            directory, manifest, name, verify=verify or name != "frames"
        )
        for name in ARRAYS
    }
    layout = store_checks.check_store(directory, manifest, arrays)
    columns = {name: RowStore.of_array(array) for name, array in arrays.items()}
    return manifest, layout, columns
