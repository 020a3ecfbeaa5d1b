"""The frame store: imitation's ``PreferenceDataset``, each frame kept once.

imitation keeps each fragment's observations, views into whole episodes that
repeat each stacked frame ``k`` times. :meth:`PreferenceDataset.push` copies pairs
into :class:`RowStore` arrays, frame stacks split into distinct frames
(:class:`StackLayout`), and evicts the oldest pairs beyond ``max_size``;
:meth:`~PreferenceDataset.save` writes a pickle-free, memory-mappable store
(:mod:`imitation_accum.io.frame_store`). Items read as imitation's; ``infos`` are
kept as JSON (numpy values round-trip, other objects as their ``repr``). Each
fragment is a row of the index, whose columns :class:`Column` names; the trainers
gather frames by id (:mod:`imitation_accum.preference.pair_table`).

Example:
    >>> from imitation_accum import PreferenceDataset  # doctest: +SKIP
    >>> dataset = PreferenceDataset(max_size=5000)  # doctest: +SKIP
    >>> dataset.push(fragment_pairs, preferences)  # doctest: +SKIP
    >>> dataset.save("preferences.store")  # doctest: +SKIP
    >>> shared = PreferenceDataset.load("preferences.store")  # memory-mapped
"""

import dataclasses
import enum
import json
import pathlib
import pickle
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.util import util
from numpy.typing import DTypeLike

from imitation_accum.io import frame_store

AnyPath = types.AnyPath
Fragment = types.Trajectory

#: imitation's own class (``pc.PreferenceDataset`` is this package's under ``patch()``).
ImitationPreferenceDataset = pc.PreferenceDataset


class Column(enum.IntEnum):
    """The columns of the fragment index (one int64 row per fragment)."""

    OBS = 0  #: id of the fragment's first observation
    TRANSITION = 1  #: id of its first transition (action and reward)
    LENGTH = 2  #: its transitions
    TERMINAL = 3  #: whether it ends its episode
    FRAME = 4  #: id of its first frame
    HAS_REWARDS = 5  #: whether it has rewards


#: Columns of the fragment index.
N_COLUMNS = len(Column)

# The store's arrays, one per column of the dataset.
_ARRAYS = (
    "frames",
    "obs_frames",
    "acts",
    "rews",
    "fragments",
    "preferences",
    "infos",  # each fragment's infos, JSON bytes end to end
    "info_spans",  # per fragment: where its infos start in infos, and their size
)

# An array's rows: their shape and dtype.
_RowType = Tuple[Tuple[int, ...], np.dtype]

#: Bytes per segment of appended rows (pages are touched only as rows fill them).
SEGMENT_BYTES = 64 * 2**20
#: Pairs copied at a time by :meth:`PreferenceDataset.of_pairs`.
_PUSH_PAIRS = 256


class RowStore:
    """Rows of one shape and dtype, addressed by an id that counts every append.

    Rows live in segments of :data:`SEGMENT_BYTES`: appending copies nothing
    stored, and dropping the oldest rows frees the segments they fill (bounded
    memory for a bounded dataset). A memory-mapped array is one read-only
    segment. Ids stay valid when older rows are dropped.

    Args:
        row_shape: Shape of one row.
        dtype: Their dtype.
    """

    def __init__(self, row_shape: Sequence[int], dtype: DTypeLike) -> None:
        self.row_shape: Tuple[int, ...] = tuple(int(n) for n in row_shape)
        self.dtype = np.dtype(dtype)
        row_bytes = max(1, int(np.prod(self.row_shape)) * self.dtype.itemsize)
        self._segment_rows = max(1, SEGMENT_BYTES // row_bytes)
        # Segments in id order: (id of row 0, array, rows filled).
        self._segments: List[Tuple[int, np.ndarray, int]] = []
        self.first = 0
        """Id of the oldest live row."""
        self.stop = 0
        """One past the id of the newest row."""

    @classmethod
    def of_array(cls, array: np.ndarray) -> "RowStore":
        """A store holding ``array`` as is (memory-mapped, say), from id 0."""
        store = cls(array.shape[1:], array.dtype)
        store._segments.append((0, array, len(array)))
        store.stop = len(array)
        return store

    def __len__(self) -> int:
        return self.stop - self.first

    @property
    def nbytes(self) -> int:
        """Bytes of the live rows."""
        return len(self) * int(np.prod(self.row_shape)) * self.dtype.itemsize

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the segments held (appended segments: their full size)."""
        return sum(array.nbytes for _, array, _ in self._segments)

    def append(self, rows: np.ndarray) -> int:
        """Copies ``rows`` in at the back (cast to this dtype); returns the first id."""
        first_id = self.stop
        done = 0
        while done < len(rows):
            if not self._segments or self._full(self._segments[-1]):
                array = np.empty((self._segment_rows, *self.row_shape), self.dtype)
                self._segments.append((self.stop, array, 0))
            start, array, filled = self._segments[-1]
            n = min(len(array) - filled, len(rows) - done)
            array[filled : filled + n] = rows[done : done + n]
            self._segments[-1] = (start, array, filled + n)
            done += n
            self.stop += n
        return first_id

    @staticmethod
    def _full(segment: Tuple[int, np.ndarray, int]) -> bool:
        _, array, filled = segment
        return filled == len(array) or not array.flags.writeable

    def drop_before(self, row_id: int) -> None:
        """Drops the rows before ``row_id``, freeing segments left with no live row."""
        self.first = max(self.first, min(int(row_id), self.stop))
        while self._segments:
            start, _, filled = self._segments[0]
            if start + filled > self.first:
                break
            self._segments.pop(0)

    def take(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (any shape of ids), gathered into one new contiguous array.

        Raises:
            IndexError: if an id is not live.
        """
        ids = np.asarray(ids, dtype=np.int64)
        flat = ids.reshape(-1)
        if len(flat) and (flat.min() < self.first or flat.max() >= self.stop):
            raise IndexError(
                f"row ids [{flat.min()}, {flat.max()}] outside the live rows "
                f"[{self.first}, {self.stop})",
            )
        out_shape = (*ids.shape, *self.row_shape)
        if len(self._segments) == 1:
            start, array, _ = self._segments[0]
            return array[flat - start].reshape(out_shape)
        starts = np.array([seg[0] for seg in self._segments], dtype=np.int64)
        which = np.searchsorted(starts, flat, side="right") - 1
        out = np.empty((len(flat), *self.row_shape), self.dtype)
        for s in np.unique(which):
            mask = which == s
            start, array, _ = self._segments[s]
            out[mask] = array[flat[mask] - start]
        return out.reshape(out_shape)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """A copy of rows ``[start, stop)`` (ids)."""
        return self.take(np.arange(start, stop, dtype=np.int64))

    def blocks(self, start: Optional[int] = None) -> List[np.ndarray]:
        """The live rows (from id ``start`` on) as views of consecutive blocks."""
        first = self.first if start is None else max(self.first, int(start))
        out = []
        for segment_start, array, filled in self._segments:
            lo = max(first, segment_start) - segment_start
            hi = min(self.stop, segment_start + filled) - segment_start
            if hi > lo:
                out.append(array[lo:hi])
        return out

    def to_array(self, start: Optional[int] = None) -> np.ndarray:
        """The live rows (from id ``start`` on) as one new array."""
        blocks = self.blocks(start)
        if not blocks:
            return np.empty((0, *self.row_shape), self.dtype)
        return np.concatenate(blocks)


@dataclasses.dataclass(frozen=True)
class StackLayout:
    """How observations split into frames.

    SB3's ``VecFrameStack`` concatenates the last ``k`` frames of ``c`` channels
    on the last axis, oldest first: observation ``t + 1`` is observation ``t``
    shifted by one frame. Where that holds bit for bit, an observation stores one
    new frame, elsewhere all ``k``: decoding is exact whatever the data.

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
        return self.obs_shape[-1] // self.channels if self.obs_shape else 1

    @property
    def frame_shape(self) -> Tuple[int, ...]:
        """Shape of one frame."""
        return (*self.obs_shape[:-1], self.channels) if self.obs_shape else ()

    def split(self, obs: np.ndarray) -> np.ndarray:
        """Observations ``(n, *obs_shape)`` as a view ``(n, k, *frame_shape)``."""
        if self.depth == 1:
            return obs[:, None]
        frames = obs.reshape(*obs.shape[:-1], self.depth, self.channels)
        return np.moveaxis(frames, -2, 1)

    def stack(self, frames: np.ndarray) -> np.ndarray:
        """Frames ``(n, k, *frame_shape)`` stacked into new contiguous observations."""
        out = np.empty((len(frames), *self.obs_shape), frames.dtype)
        np.copyto(self.split(out), frames)
        return out


def _shifts(obs: np.ndarray, layout: StackLayout) -> np.ndarray:
    """Whether each observation after the first is its predecessor shifted a frame."""
    if layout.depth == 1 or len(obs) < 2:
        return np.zeros(max(len(obs) - 1, 0), dtype=bool)
    c = layout.channels
    same = obs[1:, ..., :-c] == obs[:-1, ..., c:]
    return same.reshape(len(obs) - 1, -1).all(1)


def choose_layout(observations: Sequence[np.ndarray]) -> StackLayout:
    """The layout that stores ``observations`` (fragments' arrays) in fewest bytes.

    Candidates: no split, then every split of the last axis into ``k >= 2`` frames,
    fewer and larger frames first; ties keep the earlier candidate.
    """
    obs_shape = tuple(observations[0].shape[1:])
    whole = StackLayout(obs_shape, obs_shape[-1] if obs_shape else 1)
    if len(obs_shape) < 2:  # vectors and scalars are not frame stacks
        return whole
    last = obs_shape[-1]
    best, best_bytes = whole, sum(len(o) for o in observations) * last
    for channels in sorted((c for c in range(1, last) if last % c == 0), reverse=True):
        layout = StackLayout(obs_shape, channels)
        n_frames = 0
        for obs in observations:
            shared = _shifts(obs, layout)
            n_frames += layout.depth * (1 + int((~shared).sum())) + int(shared.sum())
        if channels * n_frames < best_bytes:
            best, best_bytes = layout, channels * n_frames
    return best


def encode_frames(
    obs: np.ndarray, layout: StackLayout
) -> Tuple[np.ndarray, np.ndarray]:
    """One fragment's observations as distinct frames plus frame indices.

    Returns:
        ``(frames, rows)``: new frames ``(m, *frame_shape)`` (sharing no memory
        with ``obs``) and, per observation, the indices of its ``k`` frames in
        ``frames``, shape ``(n, k)``, oldest first.
    """
    k = layout.depth
    shared = _shifts(obs, layout)
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
    return layout.split(obs)[new], rows  # boolean indexing copies


class PreferenceDataset(ImitationPreferenceDataset):
    """Fragment pairs and preferences, every distinct frame stored once.

    Args:
        max_size: Pairs kept; when a push goes beyond it the oldest pairs are
            evicted (imitation's ``comparison_queue_size``). ``None``: no bound.

    Raises:
        ValueError: if ``max_size`` is not ``None`` or a positive integer.
    """

    def __init__(self, max_size: Optional[int] = None) -> None:
        # imitation's __init__ assigns lists to what are views here.
        if max_size is not None and (
            isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer))
        ):
            raise ValueError(f"max_size={max_size!r} must be None or an integer")
        if max_size is not None and max_size < 1:
            raise ValueError(f"max_size={max_size} must be at least 1 (or None)")
        self.max_size = max_size
        self._layout: Optional[StackLayout] = None
        self._columns: Dict[str, RowStore] = {}
        self._fingerprint: Optional[str] = None
        self._source: Optional[pathlib.Path] = None
        self._env_id: Optional[str] = None
        # The grown store this dataset appends to, and each array's first id when
        # that store began (see append_to).
        self._appending: Optional[Tuple[frame_store.Appender, Dict[str, int]]] = None

    def __len__(self) -> int:
        return len(self._columns["preferences"]) if self._columns else 0

    def __getitem__(self, key):
        """``((fragment_1, fragment_2), preference)``, as imitation's dataset gives.

        A slice gives ``((fragments_1, fragments_2), preferences)``.
        """
        if not isinstance(key, slice):
            key = _position(key, len(self))
        return (self.fragments1[key], self.fragments2[key]), self.preferences[key]

    @property
    def fragments1(self) -> Sequence[Fragment]:  # type: ignore[override]
        """The first fragments, materialized on access (read-only)."""
        return _SideFragments(self, 0)

    @property
    def fragments2(self) -> Sequence[Fragment]:  # type: ignore[override]
        """The second fragments, materialized on access (read-only)."""
        return _SideFragments(self, 1)

    @property
    def preferences(self) -> np.ndarray:  # type: ignore[override]
        """Probability that each first fragment is preferred (float64, as imitation).

        A new read-only array: assigning to it raises ``ValueError`` rather than
        being lost.
        """
        out = (
            self._columns["preferences"].to_array().astype(np.float64)
            if self._columns
            else np.array([])
        )
        out.flags.writeable = False
        return out

    @property
    def layout(self) -> Optional[StackLayout]:
        """How observations split into frames (``None`` before the first push)."""
        return self._layout

    @property
    def source(self) -> Optional[pathlib.Path]:
        """The store this dataset was loaded from or saved to, while unchanged."""
        return self._source

    @property
    def env_id(self) -> Optional[str]:
        """The environment id the store records (``None`` if none: older stores)."""
        return self._env_id

    @property
    def nbytes(self) -> Dict[str, int]:
        """Bytes held per array (frames, frame indices, actions, ...)."""
        return {name: column.nbytes for name, column in self._columns.items()}

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the arrays' segments (memory-mapped ones included)."""
        return sum(column.allocated_bytes for column in self._columns.values())

    def _fragment(self, position: int) -> Fragment:
        """Fragment ``position`` (``2 * pair + side``), materialized."""
        cols = self._columns
        row = cols["fragments"].take(np.array([cols["fragments"].first + position]))[0]
        length, first = int(row[Column.LENGTH]), row[Column.TRANSITION]
        obs = self.observations_at(np.arange(length + 1) + row[Column.OBS])
        acts = cols["acts"].rows(first, first + length)
        terminal = bool(row[Column.TERMINAL])
        spans = cols["info_spans"]
        start, size = spans.take(np.array([spans.first + position]))[0]
        infos = self._infos(position, cols["infos"].rows(start, start + size))
        if not row[Column.HAS_REWARDS]:
            return types.Trajectory(obs=obs, acts=acts, infos=infos, terminal=terminal)
        rews = cols["rews"].rows(first, first + length)
        return types.TrajectoryWithRew(
            obs=obs, acts=acts, infos=infos, terminal=terminal, rews=rews
        )

    def _infos(self, position: int, data: np.ndarray) -> Optional[np.ndarray]:
        """Fragment ``position``'s infos from their JSON bytes ``data``.

        Raises:
            imitation_accum.io.frame_store.StoreError: naming ``infos.npy`` and the
                pair, if a loaded store's bytes are not infos as saved.
        """
        try:
            return _decode_infos(data.tobytes())
        except (ValueError, TypeError, KeyError) as error:
            where = "infos" if self._source is None else self._source / "infos.npy"
            raise frame_store.StoreError(
                f"{where}: the infos of pair {position // 2}, side {position % 2} "
                f"are not valid ({type(error).__name__}: {error})"
            ) from error

    def fragment_index(self, pairs: np.ndarray) -> np.ndarray:
        """The index rows (:class:`Column`) of pairs ``pairs``: shape ``(n, 2, 6)``."""
        fragments = self._columns["fragments"]
        pairs = np.asarray(pairs, dtype=np.int64)
        ids = fragments.first + 2 * pairs[:, None] + np.arange(2)
        return fragments.take(ids)

    def observations_at(self, obs_ids: np.ndarray) -> np.ndarray:
        """Observations ``obs_ids``, gathered into one new contiguous array."""
        assert self._layout is not None
        frame_ids = self._columns["obs_frames"].take(obs_ids)
        return self._layout.stack(self._columns["frames"].take(frame_ids))

    def actions_at(self, transition_ids: np.ndarray) -> np.ndarray:
        """Actions of transitions ``transition_ids``, gathered."""
        return self._columns["acts"].take(transition_ids)

    def rewards_at(self, transition_ids: np.ndarray) -> np.ndarray:
        """Rewards of transitions ``transition_ids``, gathered."""
        return self._columns["rews"].take(transition_ids)

    def push(
        self,
        fragments: Sequence[Tuple[Fragment, Fragment]],
        preferences: np.ndarray,
    ) -> None:
        """Copies pairs in (no view of their trajectories is kept); evicts the oldest.

        Args:
            fragments: Pairs of fragments.
            preferences: Probability that each first fragment is preferred,
                float32 of shape ``(len(fragments),)``.

        Raises:
            ValueError: as imitation's for ``preferences``; naming the first
                preference outside ``[0, 1]`` (or NaN); naming the fragment
                (``fragments[i][j]``) whose observations or actions are
                dictionaries or differ from the dataset's. Nothing is then stored.
        """
        if preferences.shape != (len(fragments),):
            raise ValueError(
                f"Unexpected preferences shape {preferences.shape}, "
                f"expected {(len(fragments),)}",
            )
        if preferences.dtype != np.float32:
            raise ValueError("preferences should have dtype float32")
        outside = np.flatnonzero(~((preferences >= 0) & (preferences <= 1)))
        if len(outside):
            i = int(outside[0])
            raise ValueError(
                f"preferences[{i}]={preferences[i]} is outside [0, 1] "
                f"({len(outside)} of {len(preferences)} are)"
            )
        if not len(fragments):
            return
        if any(len(pair) != 2 for pair in fragments):
            raise ValueError("fragments must be pairs of fragments")
        flat = [frag for pair in fragments for frag in pair]
        if self._columns:
            assert self._layout is not None
            acts = self._columns["acts"]
            frames_dtype = self._columns["frames"].dtype
            holder = "; this dataset holds"
            expected = (
                (self._layout.obs_shape, frames_dtype),
                (acts.row_shape, acts.dtype),
            )
        else:
            holder, expected = ", but fragments[0][0] has", _row_types(flat[0])
        for position, frag in enumerate(flat):
            name = f"fragments[{position // 2}][{position % 2}]"
            if isinstance(frag.obs, types.DictObs):
                raise ValueError(f"{name}: dictionary observations are not supported")
            if len(frag.acts) < 1:
                raise ValueError(f"{name} has no transitions")
            for kind, (shape, dtype), (want_shape, want_dtype) in zip(
                ("observations", "actions"), _row_types(frag), expected
            ):
                if (shape, dtype) != (want_shape, want_dtype):
                    raise ValueError(
                        f"{name} has {kind} {dtype} {shape}{holder} {want_dtype} "
                        f"{want_shape}",
                    )
        if not self._columns:
            observations = [np.asarray(f.obs) for f in flat]
            self._create(choose_layout(observations), flat[0])
        for frag in flat:
            self._append(frag)
        self._columns["preferences"].append(preferences)
        self._evict()
        self._fingerprint = None
        self._source = None

    def _create(self, layout: StackLayout, first: Fragment) -> None:
        obs, acts = np.asarray(first.obs), np.asarray(first.acts)
        rews = getattr(first, "rews", None)
        self._layout = layout
        self._columns = {
            "frames": RowStore(layout.frame_shape, obs.dtype),
            "obs_frames": RowStore((layout.depth,), np.int64),
            "acts": RowStore(acts.shape[1:], acts.dtype),
            "rews": RowStore((), np.float32 if rews is None else rews.dtype),
            "fragments": RowStore((N_COLUMNS,), np.int64),
            "preferences": RowStore((), np.float32),
            "infos": RowStore((), np.uint8),
            "info_spans": RowStore((2,), np.int64),
        }

    def _append(self, frag: Fragment) -> None:
        assert self._layout is not None
        cols = self._columns
        frames, rows = encode_frames(np.asarray(frag.obs), self._layout)
        frame_id = cols["frames"].append(frames)
        obs_id = cols["obs_frames"].append(rows + frame_id)
        trans_id = cols["acts"].append(np.asarray(frag.acts))
        rews = getattr(frag, "rews", None)
        cols["rews"].append(np.zeros(len(frag.acts)) if rews is None else rews)
        encoded = np.frombuffer(_encode_infos(frag.infos), dtype=np.uint8)
        info_id = cols["infos"].append(encoded)
        cols["info_spans"].append(np.array([[info_id, len(encoded)]], np.int64))
        row = {
            Column.OBS: obs_id,
            Column.TRANSITION: trans_id,
            Column.LENGTH: len(frag.acts),
            Column.TERMINAL: frag.terminal,
            Column.FRAME: frame_id,
            Column.HAS_REWARDS: rews is not None,
        }
        cols["fragments"].append(np.array([[row[c] for c in Column]], np.int64))

    def _evict(self) -> None:
        if self.max_size is None or len(self) <= self.max_size:
            return
        cols = self._columns
        first_pair = cols["preferences"].first + len(self) - self.max_size
        cols["preferences"].drop_before(first_pair)
        first = cols["fragments"].take(np.array([2 * first_pair]))[0]
        cols["fragments"].drop_before(2 * first_pair)
        first_infos = cols["info_spans"].take(np.array([2 * first_pair]))[0, 0]
        cols["info_spans"].drop_before(2 * first_pair)
        cols["infos"].drop_before(first_infos)
        cols["obs_frames"].drop_before(first[Column.OBS])
        cols["acts"].drop_before(first[Column.TRANSITION])
        cols["rews"].drop_before(first[Column.TRANSITION])
        cols["frames"].drop_before(first[Column.FRAME])

    def _arrays(
        self, skip: Optional[Mapping[str, int]] = None
    ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        """Blocks, shapes and metadata of the store file format (ids from 0).

        ``skip``: per array, rows left out at its start (those a store holds); the
        shapes are the whole arrays'.
        """
        assert self._layout is not None
        columns = self._columns
        start = {
            name: column.first + (skip or {}).get(name, 0)
            for name, column in columns.items()
        }
        fragments = columns["fragments"].to_array(start["fragments"])
        if len(fragments):  # ids of observations, transitions and frames shift
            shift = np.zeros(N_COLUMNS, np.int64)
            shift[[Column.OBS, Column.TRANSITION, Column.FRAME]] = [
                columns[name].first for name in ("obs_frames", "acts", "frames")
            ]
            fragments = fragments - shift
        obs_frames = columns["obs_frames"].to_array(start["obs_frames"])
        info_spans = columns["info_spans"].to_array(start["info_spans"])
        small = {
            "obs_frames": obs_frames - columns["frames"].first,
            "fragments": fragments,
            "info_spans": info_spans - np.array([columns["infos"].first, 0]),
        }
        blocks = {
            name: [small[name]] if name in small else columns[name].blocks(start[name])
            for name in _ARRAYS
        }
        shapes = {
            name: ((len(columns[name]), *columns[name].row_shape), columns[name].dtype)
            for name in _ARRAYS
        }
        metadata = {
            "obs_shape": list(self._layout.obs_shape),
            "channels": self._layout.channels,
            "n_pairs": len(self),
            "max_size": self.max_size,
        }
        return blocks, shapes, metadata

    def save(self, path: AnyPath, *, env_id: Optional[str] = None) -> None:
        """Writes the dataset as a frame store directory, atomically (see :meth:`load`).

        Args:
            path: The store's directory (replaced if it holds a store).
            env_id: The environment the pairs come from (a gymnasium id), recorded
                in the manifest and read back as :attr:`env_id`. ``None`` keeps
                the one this dataset has (from the store it was loaded from or
                saved to), if any. Not part of :meth:`fingerprint`.

        Raises:
            ValueError: if the dataset is empty, or ``env_id`` is an empty string.
            TypeError: if ``env_id`` is not a string.
            OSError: as :func:`~imitation_accum.io.frame_store.write_store`.
        """
        if env_id is not None and not isinstance(env_id, str):
            raise TypeError(f"env_id={env_id!r} must be a string (or None)")
        if env_id == "":
            raise ValueError("env_id='' must name an environment (or be None)")
        if not self._columns:
            raise ValueError("the dataset is empty: push some pairs before saving")
        directory = util.parse_path(path)
        env_id = self._env_id if env_id is None else env_id
        blocks, shapes, metadata = self._arrays()
        manifest = frame_store.write_store(
            directory, blocks, shapes, metadata, env_id=env_id
        )
        self._fingerprint = frame_store.fingerprint_of(manifest)
        self._source = directory
        self._env_id = env_id

    @classmethod
    def load(cls, path: AnyPath, verify: bool = True) -> "PreferenceDataset":
        """Opens a store written by :meth:`save`, memory-mapped and read-only.

        Pairs pushed later go to memory. Every array is checked against its
        SHA-256 (the frames unless ``verify=False``), and against each other.

        Args:
            path: The store's directory.
            verify: Check the frames' SHA-256 too (reads every frame once: a small
                share of one training epoch, ``docs/frame_store.md``).

        Returns:
            The dataset, with ``max_size`` and :attr:`env_id` as saved.

        Raises:
            imitation_accum.io.frame_store.StoreError: naming the file or manifest
                entry, if the store is missing, truncated, corrupt, inconsistent,
                of another version, or names or links to anything outside it.
        """
        directory = util.parse_path(path)
        manifest = frame_store.read_manifest(directory)
        arrays = {
            name: frame_store.open_array(
                directory, manifest, name, verify=verify or name != "frames"
            )
            for name in _ARRAYS
        }
        return cls._of_store(directory, manifest, arrays)

    @classmethod
    def of_pairs(
        cls, dataset: Any, max_size: Optional[int] = None
    ) -> "PreferenceDataset":
        """A new dataset holding the pairs of ``dataset``, pushed a block at a time.

        Args:
            dataset: imitation's ``PreferenceDataset`` (its ``max_size`` is kept
                unless one is given), or items ``((fragment_1, fragment_2), p)``.
            max_size: As the constructor's.

        Raises:
            ValueError: as :meth:`push`.
        """
        if isinstance(dataset, ImitationPreferenceDataset):
            pairs = list(zip(dataset.fragments1, dataset.fragments2))
            preferences = np.asarray(dataset.preferences, np.float32)
            max_size = dataset.max_size if max_size is None else max_size
        else:
            items = [dataset[i] for i in range(len(dataset))]
            pairs = [(item[0][0], item[0][1]) for item in items]
            preferences = np.asarray([item[1] for item in items], np.float32)
        copy = cls(max_size=max_size)
        for start in range(0, len(pairs), _PUSH_PAIRS):
            stop = start + _PUSH_PAIRS
            copy.push(pairs[start:stop], preferences[start:stop])
        return copy

    @classmethod
    def _of_store(
        cls,
        directory: pathlib.Path,
        manifest: Mapping[str, Any],
        arrays: Mapping[str, np.ndarray],
    ) -> "PreferenceDataset":
        """The dataset of a store's opened arrays, checked against each other."""
        layout = _check_store(directory, manifest, arrays)
        dataset = cls(max_size=manifest.get("metadata", {}).get("max_size"))
        dataset._env_id = manifest.get("env_id")
        dataset._layout = layout
        dataset._columns = {name: RowStore.of_array(a) for name, a in arrays.items()}
        dataset._fingerprint = frame_store.fingerprint_of(manifest)
        dataset._source = directory
        return dataset

    def append_to(self, store: frame_store.Appender) -> Optional[Dict[str, Any]]:
        """Appends the pairs pushed since ``store``'s committed ones; its new manifest.

        Only the new rows are written (:meth:`~frame_store.Appender.append`); they
        hold once ``store.commit()`` is called. A store only grows: if pairs were
        evicted since ``store`` began, or it holds rows this dataset did not
        append, nothing is written and ``None`` is returned (append to a new
        store then).

        Raises:
            ValueError: if the dataset is empty.
        """
        if not self._columns:
            raise ValueError("the dataset is empty: push some pairs before appending")
        firsts = {name: column.first for name, column in self._columns.items()}
        if store.manifest is None:
            self._appending = (store, firsts)
        elif self._appending is None or self._appending[0] is not store:
            return None
        if self._appending[1] != firsts:
            return None
        skip = {name: store.rows(name) for name in _ARRAYS}
        blocks, shapes, metadata = self._arrays(skip)
        manifest = store.append(blocks, shapes, metadata, env_id=self._env_id)
        self._fingerprint = frame_store.fingerprint_of(manifest)
        self._source = store.path
        return manifest

    @classmethod
    def open_committed(
        cls, path: AnyPath, manifest: Mapping[str, Any], source: str
    ) -> Tuple["PreferenceDataset", frame_store.Appender]:
        """Opens a store grown by :meth:`append_to` as a committed manifest records it.

        As :meth:`load`, but only the rows ``manifest`` commits
        (:func:`imitation_accum.io.frame_store.open_committed`, ``source`` naming it).

        Returns:
            The dataset, and the appender :meth:`append_to` grows the store with.

        Raises:
            imitation_accum.io.frame_store.StoreError: naming the file at fault.
        """
        directory = util.parse_path(path)
        arrays, store = frame_store.open_committed(directory, manifest, source, _ARRAYS)
        dataset = cls._of_store(directory, manifest, arrays)
        dataset._appending = (store, {name: 0 for name in _ARRAYS})
        return dataset, store

    def fingerprint(self) -> str:
        """The one fingerprint of preference data: a SHA-256 of the content.

        :func:`~imitation_accum.io.frame_store.fingerprint_of` of the store's
        manifest (another dataset's is that of :meth:`of_pairs`). Equal for a
        dataset, the store saved from it and that store loaded; read from the
        manifest of a store as loaded or saved, else hashed once per push.
        """
        if self._fingerprint is None:
            if not self._columns:
                return frame_store.fingerprint_of({"arrays": {}, "metadata": {}})
            blocks, shapes, metadata = self._arrays()
            self._fingerprint = frame_store.fingerprint_of(
                frame_store.describe(blocks, shapes, metadata),
            )
        return self._fingerprint

    def check_observation_space(self, space: Any, name: str = "dataset") -> None:
        """Raises if observations do not fit the environment's ``space``.

        Args:
            space: A gymnasium ``Box`` (anything with ``shape`` and ``dtype``).
            name: What to call the dataset in the message (e.g. its path).

        Raises:
            ValueError: naming ``name`` (or the store's frames file), if the shape
                or dtype differs.
        """
        if self._layout is None:
            return
        where = name if self._source is None else str(self._source / "frames.npy")
        shape, dtype = self._layout.obs_shape, self._columns["frames"].dtype
        if tuple(space.shape) != shape or np.dtype(space.dtype) != dtype:
            raise ValueError(
                f"{where}: observations are {dtype} {shape}, but the environment's "
                f"observation space is {np.dtype(space.dtype)} {tuple(space.shape)}",
            )


def _row_types(frag: Fragment) -> Tuple[_RowType, _RowType]:
    """The row types of a fragment's observations and actions."""
    obs, acts = np.asarray(frag.obs), np.asarray(frag.acts)
    return (obs.shape[1:], obs.dtype), (acts.shape[1:], acts.dtype)


def _position(key: Any, n: int) -> int:
    """``key`` as an index into ``n`` pairs (negative from the end).

    Raises:
        IndexError: if it is out of range.
    """
    i = int(key)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError(f"index {key} out of range for {n} pairs")
    return i


class _SideFragments(Sequence[Fragment]):
    """One side's fragments, materialized on access (imitation keeps lists)."""

    def __init__(self, dataset: PreferenceDataset, side: int) -> None:
        self._dataset = dataset
        self._side = side

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [self[i] for i in range(len(self))[key]]
        i = _position(key, len(self))
        return self._dataset._fragment(2 * i + self._side)

    def __add__(self, other: Sequence[Fragment]) -> List[Fragment]:
        # imitation's fragments are lists; code that concatenates them keeps working.
        return [*self, *other]

    def __radd__(self, other: Sequence[Fragment]) -> List[Fragment]:
        return [*other, *self]


def _check_store(
    directory: pathlib.Path,
    manifest: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
) -> StackLayout:
    """The store's stack layout, its arrays checked against each other.

    So that no index read later points outside its array.

    Raises:
        imitation_accum.io.frame_store.StoreError: naming the file at fault.
    """
    layout = _layout_of(directory, manifest.get("metadata", {}))

    def fail(name: str, what: str) -> frame_store.StoreError:
        return frame_store.StoreError(f"{directory / (name + '.npy')}: {what}")

    for name, kind in _ARRAY_KINDS.items():
        if arrays[name].dtype.kind not in kind:
            raise fail(name, f"dtype {arrays[name].dtype} is not {_KIND_NAMES[kind]}")
    frames, obs_frames = arrays["frames"], arrays["obs_frames"]
    fragments, prefs = arrays["fragments"], arrays["preferences"]
    recorded = (
        f"the manifest's obs_shape={list(layout.obs_shape)} and "
        f"channels={layout.channels}"
    )
    if tuple(frames.shape[1:]) != layout.frame_shape:
        raise fail(
            "frames",
            f"frames of shape {frames.shape[1:]}, but {recorded} need "
            f"{layout.frame_shape}",
        )
    if obs_frames.shape[1:] != (layout.depth,):
        raise fail(
            "obs_frames",
            f"rows of {obs_frames.shape[1:]} frames, but {recorded} need "
            f"({layout.depth},)",
        )
    if fragments.shape[1:] != (N_COLUMNS,) or len(fragments) != 2 * len(prefs):
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
        obs, trans = fragments[:, Column.OBS], fragments[:, Column.TRANSITION]
        length = fragments[:, Column.LENGTH]
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


# What the index arrays must hold, so that reading them gives ids and bytes.
_ARRAY_KINDS = {
    "obs_frames": "i",
    "fragments": "i",
    "info_spans": "i",
    "infos": "u",
    "preferences": "f",
}
_KIND_NAMES = {"i": "signed integers", "u": "bytes", "f": "floating point"}


def _layout_of(directory: pathlib.Path, metadata: Mapping[str, Any]) -> StackLayout:
    """The stack layout the manifest's metadata records, checked for consistency.

    Raises:
        imitation_accum.io.frame_store.StoreError: naming the manifest and key.
    """
    where = directory / frame_store.MANIFEST
    obs_shape, channels = metadata.get("obs_shape"), metadata.get("channels")
    if not isinstance(obs_shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in obs_shape
    ):
        raise frame_store.StoreError(
            f"{where}: metadata obs_shape={obs_shape!r} is not a list of sizes"
        )
    # Frames split the last axis evenly; a scalar observation is one frame.
    last = obs_shape[-1] if obs_shape else 1
    if (
        not isinstance(channels, int)
        or isinstance(channels, bool)
        or channels < 1
        or last % channels
    ):
        raise frame_store.StoreError(
            f"{where}: metadata channels={channels!r} does not divide the last axis "
            f"of obs_shape={obs_shape}"
        )
    max_size = metadata.get("max_size")
    if max_size is not None and (not isinstance(max_size, int) or max_size < 1):
        raise frame_store.StoreError(
            f"{where}: metadata max_size={max_size!r} is not None or a size >= 1"
        )
    return StackLayout(tuple(obs_shape), channels)


# -- a fragment's infos as JSON bytes -------------------------------------------

_ARRAY, _REPR = "__ndarray__", "__repr__"


def _encode_infos(infos: Optional[Any]) -> bytes:
    """The JSON bytes of a fragment's infos (``None`` or a sequence of dicts)."""
    value = None if infos is None else list(infos)
    return json.dumps(value, default=_encode_value, separators=(",", ":")).encode()


def _decode_infos(data: bytes) -> Optional[np.ndarray]:
    """Infos as imitation keeps them: ``None`` or an object array of dicts.

    Raises:
        ValueError: if ``data`` is not such a JSON document.
    """
    value = json.loads(data.decode(), object_hook=_decode_value)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError("not a JSON list of dictionaries")
    infos = np.empty(len(value), dtype=object)
    infos[:] = value
    return infos


def _encode_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {_ARRAY: value.tolist(), "dtype": value.dtype.str, "shape": value.shape}
    if isinstance(value, np.generic):
        return value.item()
    warnings.warn(
        f"an info value of type {type(value).__name__} is kept as its repr "
        "(a frame store holds JSON, not pickles)",
        RuntimeWarning,
        stacklevel=2,
    )
    return {_REPR: repr(value)}


def _decode_value(value: dict) -> Any:
    if _ARRAY in value:
        array = np.array(value[_ARRAY], dtype=np.dtype(value["dtype"]))
        return array.reshape(value["shape"])
    return value


# -- what imitation's PreferenceDataset.save pickled ----------------------------


class _ImitationUnpickler(pickle.Unpickler):
    # Resolves imitation's dataset class to imitation's, also under patch().
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == (pc.__name__, "PreferenceDataset"):
            return ImitationPreferenceDataset
        return super().find_class(module, name)


def read_imitation_pickle(path: AnyPath, name: str) -> ImitationPreferenceDataset:
    """Loads what imitation's ``PreferenceDataset.save`` wrote (a trusted pickle).

    Loading a pickle runs any code it holds. The dataset comes back as imitation's
    class, also under ``patch()``; ``name`` names the file in messages.

    Raises:
        ValueError: naming ``name`` if the file does not unpickle to imitation's
            ``PreferenceDataset``, or is a directory (saying how to load that).
    """
    if util.parse_path(path).is_dir():
        raise ValueError(
            f"{name} is a directory, not a pickle: a frame store, which "
            "PreferenceDataset.save writes (also imitation's save_preferences=True "
            "under imitation_accum.patch(), at preferences.pkl); load it with "
            "imitation_accum.PreferenceDataset.load(path), or with imitation's "
            "PreferenceDataset.load under imitation_accum.patched()"
        )
    try:
        with open(util.parse_path(path), "rb") as file:
            dataset = _ImitationUnpickler(file).load()
    except Exception as error:
        raise ValueError(
            f"{name} is not a readable PreferenceDataset pickle "
            f"({type(error).__name__}: {error})",
        ) from error
    if not isinstance(dataset, ImitationPreferenceDataset):
        raise ValueError(
            f"{name} holds a {type(dataset).__name__}, not an imitation "
            "PreferenceDataset",
        )
    return dataset


__all__: List[str] = ["PreferenceDataset", "read_imitation_pickle"]
