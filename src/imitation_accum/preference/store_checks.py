"""Consistency checks of a frame store's arrays, before any of it is used.

Each file has been checked against the manifest (shape, dtype, size, and the
digest of every array but the frames); these checks make sure the arrays agree
with each other, so that no index read later points outside its array.
"""

import pathlib
from typing import Any, Mapping

import numpy as np

from imitation_accum.io.frame_store import MANIFEST, StoreError
from imitation_accum.preference import frame_stacks


def check_store(
    directory: pathlib.Path,
    manifest: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
) -> frame_stacks.StackLayout:
    """Checks a store's arrays against each other and its metadata.

    Args:
        directory: The store's directory (for messages).
        manifest: Its manifest.
        arrays: Its arrays, by name.

    Returns:
        The store's stack layout.

    Raises:
        StoreError: naming the file at fault.
    """
    try:
        metadata = manifest["metadata"]
        layout = frame_stacks.StackLayout(
            tuple(int(n) for n in metadata["obs_shape"]),
            int(metadata["channels"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        where = directory / MANIFEST
        raise StoreError(f"{where}: invalid metadata ({error})") from error

    def fail(name: str, what: str) -> StoreError:
        return StoreError(f"{directory / (name + '.npy')}: {what}")

    frames, obs_frames = arrays["frames"], arrays["obs_frames"]
    fragments, prefs = arrays["fragments"], arrays["preferences"]
    if tuple(frames.shape[1:]) != layout.frame_shape:
        raise fail(
            "frames",
            f"frames of shape {frames.shape[1:]}, the manifest's "
            f"layout needs {layout.frame_shape}",
        )
    if obs_frames.shape[1:] != (layout.depth,):
        raise fail(
            "obs_frames",
            f"rows of shape {obs_frames.shape[1:]}, expected ({layout.depth},)",
        )
    if fragments.shape[1:] != (6,) or len(fragments) != 2 * len(prefs):
        raise fail(
            "fragments", f"shape {fragments.shape} does not index {len(prefs)} pairs"
        )
    if len(arrays["rews"]) != len(arrays["acts"]):
        raise fail(
            "rews", f"{len(arrays['rews'])} rewards for {len(arrays['acts'])} actions"
        )
    if len(obs_frames) and (obs_frames.min() < 0 or obs_frames.max() >= len(frames)):
        raise fail("obs_frames", f"frame index outside [0, {len(frames)})")
    if len(fragments):
        obs, trans, length = fragments[:, 0], fragments[:, 1], fragments[:, 2]
        if (length < 1).any():
            raise fail("fragments", "a fragment with no transitions")
        if obs.min() < 0 or (obs + length + 1).max() > len(obs_frames):
            raise fail("fragments", "observation index outside obs_frames.npy")
        if trans.min() < 0 or (trans + length).max() > len(arrays["acts"]):
            raise fail("fragments", "transition index outside acts.npy")
    spans = arrays["info_spans"]
    if spans.shape != (len(fragments), 2):
        raise fail("info_spans", f"shape {spans.shape}, expected ({len(fragments)}, 2)")
    if len(spans) and (
        spans.min() < 0 or (spans[:, 0] + spans[:, 1]).max() > len(arrays["infos"])
    ):
        raise fail("info_spans", "a span outside infos.npy")
    if not ((prefs >= 0) & (prefs <= 1)).all():
        raise fail("preferences", "a preference outside [0, 1]")
    return layout
