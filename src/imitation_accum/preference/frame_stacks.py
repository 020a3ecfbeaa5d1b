"""Frame stacks split into their frames, each distinct frame kept once.

SB3's ``VecFrameStack`` (channels last) concatenates the last ``k`` frames of
``c`` channels each on the last axis, oldest first: observation ``t + 1`` is
observation ``t`` shifted by one frame, with the new frame at the end. A fragment's
observations are stored as single frames plus, per observation, the ids of its
``k`` frames; observation ``t + 1`` reuses observation ``t``'s last ``k - 1``
frames wherever the shift holds bit for bit, and gets ``k`` frames of its own
where it does not (an episode start inside the fragment, or data that is not a
frame stack). Decoding is therefore exact whatever the data; the layout only
decides how much is saved. Observations that are not stacks are one "frame" each
(``k = 1``).
"""

import dataclasses
from typing import Sequence, Tuple

import numpy as np


@dataclasses.dataclass(frozen=True)
class StackLayout:
    """How observations split into frames.

    Attributes:
        obs_shape: Shape of one observation.
        channels: Channels per frame on the last axis (``obs_shape[-1]`` when
            observations are not split).
    """

    obs_shape: Tuple[int, ...]
    channels: int

    @property
    def depth(self) -> int:
        """Frames per observation (``k``)."""
        if not self.obs_shape:
            return 1
        return self.obs_shape[-1] // self.channels

    @property
    def frame_shape(self) -> Tuple[int, ...]:
        """Shape of one frame."""
        if not self.obs_shape:
            return ()
        return (*self.obs_shape[:-1], self.channels)

    def split(self, obs: np.ndarray) -> np.ndarray:
        """Observations ``(n, *obs_shape)`` as a view ``(n, k, *frame_shape)``."""
        if self.depth == 1:
            return obs[:, None]
        frames = obs.reshape(*obs.shape[:-1], self.depth, self.channels)
        return np.moveaxis(frames, -2, 1)

    def stack(self, frames: np.ndarray) -> np.ndarray:
        """Frames ``(n, k, *frame_shape)`` stacked into new contiguous observations."""
        n = len(frames)
        out = np.empty((n, *self.obs_shape), frames.dtype)
        np.copyto(self.split(out), frames)
        return out


def shifts(obs: np.ndarray, layout: StackLayout) -> np.ndarray:
    """Whether each observation after the first is its predecessor shifted by a frame.

    Args:
        obs: Observations ``(n, *obs_shape)``.
        layout: The layout.

    Returns:
        ``n - 1`` flags.
    """
    if layout.depth == 1 or len(obs) < 2:
        return np.zeros(max(len(obs) - 1, 0), dtype=bool)
    c = layout.channels
    same = obs[1:, ..., :-c] == obs[:-1, ..., c:]
    return same.reshape(len(obs) - 1, -1).all(1)


def stored_frames(obs: np.ndarray, layout: StackLayout) -> int:
    """Frames stored for one fragment's observations under ``layout``."""
    shared = shifts(obs, layout)
    return layout.depth * (1 + int((~shared).sum())) + int(shared.sum())


def choose_layout(observations: Sequence[np.ndarray]) -> StackLayout:
    """The layout that stores ``observations`` (fragments' arrays) in fewest bytes.

    Candidates: no split, and every split of the last axis into ``k >= 2`` frames
    of ``c`` channels. Ties keep the candidate tried first (no split, then fewer,
    larger frames).

    Args:
        observations: Observation arrays ``(n_i, *obs_shape)`` of equal shape.

    Returns:
        The layout.
    """
    obs_shape = tuple(observations[0].shape[1:])
    whole = StackLayout(obs_shape, obs_shape[-1] if obs_shape else 1)
    if len(obs_shape) < 2:  # vectors and scalars are not frame stacks
        return whole
    last = obs_shape[-1]
    best, best_bytes = whole, sum(len(o) for o in observations) * last
    for channels in sorted((c for c in range(1, last) if last % c == 0), reverse=True):
        layout = StackLayout(obs_shape, channels)
        n_bytes = channels * sum(stored_frames(o, layout) for o in observations)
        if n_bytes < best_bytes:
            best, best_bytes = layout, n_bytes
    return best


def encode(obs: np.ndarray, layout: StackLayout) -> Tuple[np.ndarray, np.ndarray]:
    """One fragment's observations as distinct frames plus frame indices.

    Args:
        obs: Observations ``(n, *obs_shape)``.
        layout: The layout.

    Returns:
        ``(frames, rows)``: new frames ``(m, *frame_shape)`` (a copy, sharing no
        memory with ``obs``) and, per observation, the indices of its ``k``
        frames in ``frames``, shape ``(n, k)``, oldest first.
    """
    k = layout.depth
    shared = shifts(obs, layout)
    # Which (observation, slot) pairs bring a new frame: all k slots of the first
    # observation and of any that is not a shift, else only the newest slot.
    new = np.ones((len(obs), k), dtype=bool)
    new[1:][shared, :-1] = False
    ids = np.cumsum(new.reshape(-1)).reshape(new.shape) - 1
    rows = np.empty((len(obs), k), dtype=np.int64)
    rows[0] = ids[0]
    for t in range(1, len(obs)):
        if shared[t - 1]:
            rows[t, :-1] = rows[t - 1, 1:]
            rows[t, -1] = ids[t, -1]
        else:
            rows[t] = ids[t]
    frames = layout.split(obs)[new]  # boolean indexing copies
    return frames, rows
