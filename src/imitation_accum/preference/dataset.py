"""A drop-in for imitation's ``PreferenceDataset`` that keeps every frame once.

imitation's dataset keeps each fragment's observation array, and a fragment is a
view into its agent trajectory: frame-stacked Atari observations repeat every
frame ``k`` times, and a kept fragment keeps its whole episode alive. This
dataset copies what it is given on :meth:`~PreferenceDataset.push` into a few
arrays (see :mod:`~imitation_accum.preference.frame_stacks` for how frame stacks
are split), evicts the oldest pairs beyond ``max_size`` and frees their frames,
and saves to a pickle-free, memory-mappable directory
(:mod:`imitation_accum.io.frame_store`). The trainers gather a chunk's frames from
those arrays directly (:mod:`imitation_accum.preference.pair_table`).

Reading an item materializes its fragments (``TrajectoryWithRew`` objects with
observations as imitation's, ``infos`` as JSON, see
:mod:`~imitation_accum.preference.info_codec`), so code written for
imitation's dataset keeps working; ``fragments1``, ``fragments2`` and
``preferences`` are read-only views.

Example:
    >>> from imitation_accum import PreferenceDataset  # doctest: +SKIP
    >>> dataset = PreferenceDataset(max_size=5000)  # doctest: +SKIP
    >>> dataset.push(fragment_pairs, preferences)  # doctest: +SKIP
    >>> dataset.save("preferences.store")  # doctest: +SKIP
    >>> shared = PreferenceDataset.load("preferences.store")  # memory-mapped
"""

import pathlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.util import util

from imitation_accum.io import frame_store
from imitation_accum.preference import (
    dataset_store,
    fragment_views,
    frame_stacks,
    info_codec,
)
from imitation_accum.preference.row_store import RowStore

AnyPath = types.AnyPath
Fragment = types.Trajectory

#: imitation's own class (``pc.PreferenceDataset`` is this package's under ``patch()``).
ImitationPreferenceDataset = pc.PreferenceDataset

# Columns of the per-fragment index.
_OBS, _TRANS, _LENGTH, _TERMINAL, _FRAME, _HAS_REWS = range(6)


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
        self._layout: Optional[frame_stacks.StackLayout] = None
        self._columns: Dict[str, RowStore] = {}
        self._fingerprint: Optional[str] = None
        self._source: Optional[pathlib.Path] = None

    # -- reading ---------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._columns["preferences"]) if self._columns else 0

    def __getitem__(self, key):
        """``((fragment_1, fragment_2), preference)``, as imitation's dataset gives.

        A slice gives ``((fragments_1, fragments_2), preferences)``.
        """
        if isinstance(key, slice):
            pairs = range(len(self))[key]
            firsts = [self._fragment(2 * i) for i in pairs]
            seconds = [self._fragment(2 * i + 1) for i in pairs]
            return (firsts, seconds), self.preferences[key]
        i = fragment_views.position(key, len(self))
        pair = (self._fragment(2 * i), self._fragment(2 * i + 1))
        return pair, self.preferences[i]

    @property
    def fragments1(self) -> Sequence[Fragment]:  # type: ignore[override]
        """The first fragments, materialized on access (read-only)."""
        return fragment_views.SideFragments(self, 0)

    @property
    def fragments2(self) -> Sequence[Fragment]:  # type: ignore[override]
        """The second fragments, materialized on access (read-only)."""
        return fragment_views.SideFragments(self, 1)

    @property
    def preferences(self) -> np.ndarray:  # type: ignore[override]
        """Probability that each first fragment is preferred (float64, as imitation)."""
        if not self._columns:
            return np.array([])
        return self._columns["preferences"].to_array().astype(np.float64)

    @property
    def layout(self) -> Optional[frame_stacks.StackLayout]:
        """How observations split into frames (``None`` before the first push)."""
        return self._layout

    @property
    def source(self) -> Optional[pathlib.Path]:
        """The store this dataset was loaded from or saved to, while unchanged."""
        return self._source

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
        length = int(row[_LENGTH])
        obs = self.observations_at(np.arange(length + 1) + row[_OBS])
        acts = cols["acts"].rows(row[_TRANS], row[_TRANS] + length)
        terminal = bool(row[_TERMINAL])
        spans = cols["info_spans"]
        start, size = spans.take(np.array([spans.first + position]))[0]
        infos = info_codec.decode(cols["infos"].rows(start, start + size).tobytes())
        if not row[_HAS_REWS]:
            return types.Trajectory(obs=obs, acts=acts, infos=infos, terminal=terminal)
        rews = cols["rews"].rows(row[_TRANS], row[_TRANS] + length)
        return types.TrajectoryWithRew(
            obs=obs, acts=acts, infos=infos, terminal=terminal, rews=rews
        )

    # -- what the trainers read (no per-fragment objects) ------------------------

    def fragment_index(self, pairs: np.ndarray) -> np.ndarray:
        """The store's index rows of the fragments of pairs ``pairs``.

        Per pair and side: first observation id, first transition id, length,
        terminal flag, first frame id and whether it has rewards.

        Args:
            pairs: Pair positions (``0 <= i < len(self)``).

        Returns:
            Shape ``(len(pairs), 2, 6)``, int64.
        """
        fragments = self._columns["fragments"]
        pairs = np.asarray(pairs, dtype=np.int64)
        ids = fragments.first + 2 * pairs[:, None] + np.arange(2)
        return fragments.take(ids)

    def observations_at(self, obs_ids: np.ndarray) -> np.ndarray:
        """Observations ``obs_ids`` (ids from :meth:`fragment_index`), stacked.

        One gather of their frames by fancy indexing, stacked into one new
        contiguous array ``(len(obs_ids), *obs_shape)`` of the stored dtype.
        """
        assert self._layout is not None
        frame_ids = self._columns["obs_frames"].take(obs_ids)
        return self._layout.stack(self._columns["frames"].take(frame_ids))

    def actions_at(self, transition_ids: np.ndarray) -> np.ndarray:
        """Actions of transitions ``transition_ids``, gathered."""
        return self._columns["acts"].take(transition_ids)

    def rewards_at(self, transition_ids: np.ndarray) -> np.ndarray:
        """Rewards of transitions ``transition_ids``, gathered."""
        return self._columns["rews"].take(transition_ids)

    # -- pushing ---------------------------------------------------------------

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
            ValueError: as imitation's for ``preferences``; naming the fragment
                (``fragments[i][j]``) whose observations or actions differ in
                shape or dtype from the dataset's, or are dictionaries. Nothing
                is stored when an error is raised.
        """
        if preferences.shape != (len(fragments),):
            raise ValueError(
                f"Unexpected preferences shape {preferences.shape}, "
                f"expected {(len(fragments),)}",
            )
        if preferences.dtype != np.float32:
            raise ValueError("preferences should have dtype float32")
        if not len(fragments):
            return
        flat = [frag for pair in fragments for frag in pair]
        for pair in fragments:
            if len(pair) != 2:
                raise ValueError("fragments must be pairs of fragments")
        reference = flat[0] if not self._columns else None
        for position, frag in enumerate(flat):
            name = f"fragments[{position // 2}][{position % 2}]"
            self._check_fragment(frag, name)
            if reference is not None:
                _check_alike(frag, reference, name)
        if not self._columns:
            observations = [np.asarray(f.obs) for f in flat]
            self._create(frame_stacks.choose_layout(observations), flat[0])
        for frag in flat:
            self._append(frag)
        self._columns["preferences"].append(preferences)
        self._evict()
        self._fingerprint = None
        self._source = None

    def _check_fragment(self, frag: Fragment, name: str) -> None:
        if isinstance(frag.obs, types.DictObs):
            raise ValueError(f"{name}: dictionary observations are not supported")
        if len(frag.acts) < 1:
            raise ValueError(f"{name} has no transitions")
        if not self._columns:
            return
        assert self._layout is not None
        obs, acts = np.asarray(frag.obs), np.asarray(frag.acts)
        expected = (self._layout.obs_shape, self._columns["frames"].dtype)
        if (obs.shape[1:], obs.dtype) != expected:
            raise ValueError(
                f"{name} has observations {obs.dtype} {obs.shape[1:]}; this dataset "
                f"holds {expected[1]} {expected[0]}",
            )
        acts_expected = (self._columns["acts"].row_shape, self._columns["acts"].dtype)
        if (acts.shape[1:], acts.dtype) != acts_expected:
            raise ValueError(
                f"{name} has actions {acts.dtype} {acts.shape[1:]}; this dataset "
                f"holds {acts_expected[1]} {acts_expected[0]}",
            )

    def _create(self, layout: frame_stacks.StackLayout, first: Fragment) -> None:
        obs, acts = np.asarray(first.obs), np.asarray(first.acts)
        rews = getattr(first, "rews", None)
        self._layout = layout
        self._columns = {
            "frames": RowStore(layout.frame_shape, obs.dtype),
            "obs_frames": RowStore((layout.depth,), np.int64),
            "acts": RowStore(acts.shape[1:], acts.dtype),
            "rews": RowStore((), np.float32 if rews is None else rews.dtype),
            "fragments": RowStore((6,), np.int64),
            "preferences": RowStore((), np.float32),
            "infos": RowStore((), np.uint8),
            "info_spans": RowStore((2,), np.int64),
        }

    def _append(self, frag: Fragment) -> None:
        assert self._layout is not None
        cols = self._columns
        frames, rows = frame_stacks.encode(np.asarray(frag.obs), self._layout)
        frame_id = cols["frames"].append(frames)
        obs_id = cols["obs_frames"].append(rows + frame_id)
        trans_id = cols["acts"].append(np.asarray(frag.acts))
        rews = getattr(frag, "rews", None)
        cols["rews"].append(np.zeros(len(frag.acts)) if rews is None else rews)
        encoded = np.frombuffer(info_codec.encode(frag.infos), dtype=np.uint8)
        info_id = cols["infos"].append(encoded)
        cols["info_spans"].append(np.array([[info_id, len(encoded)]], np.int64))
        cols["fragments"].append(
            np.array(
                [
                    [
                        obs_id,
                        trans_id,
                        len(frag.acts),
                        frag.terminal,
                        frame_id,
                        rews is not None,
                    ]
                ],
                dtype=np.int64,
            ),
        )

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
        cols["obs_frames"].drop_before(first[_OBS])
        cols["acts"].drop_before(first[_TRANS])
        cols["rews"].drop_before(first[_TRANS])
        cols["frames"].drop_before(first[_FRAME])

    # -- files -----------------------------------------------------------------

    def _arrays(self) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        """Blocks, shapes and metadata of the store file format (ids from 0)."""
        assert self._layout is not None
        return dataset_store.store_arrays(
            self._columns, self._layout, n_pairs=len(self), max_size=self.max_size
        )

    def save(self, path: AnyPath) -> None:
        """Writes the dataset as a frame store: a directory (see :meth:`load`).

        Written atomically: ``path`` holds the old store or the new one.

        Args:
            path: The store's directory (replaced if it holds a store).

        Raises:
            ValueError: if the dataset is empty.
        """
        if not self._columns:
            raise ValueError("the dataset is empty: push some pairs before saving")
        directory = util.parse_path(path)
        blocks, shapes, metadata = self._arrays()
        manifest = frame_store.write_store(directory, blocks, shapes, metadata)
        self._fingerprint = frame_store.fingerprint_of(manifest)
        self._source = directory

    @staticmethod
    def load(path: AnyPath, verify: bool = False) -> "PreferenceDataset":
        """Opens a store written by :meth:`save`, memory-mapped and read-only.

        Pairs pushed later go to memory; the store's files are never written.
        The frame indices, fragment index, actions, rewards and preferences are
        checked against their recorded SHA-256 and against each other; the
        frames only for their size (and their digest with ``verify``).

        Args:
            path: The store's directory.
            verify: Also check the frames' SHA-256 (reads every frame once).

        Returns:
            The dataset, with ``max_size`` as saved.

        Raises:
            imitation_accum.io.frame_store.StoreError: naming the file, if the
                store is missing, truncated, corrupt or of another version.
        """
        directory = util.parse_path(path)
        manifest, layout, columns = dataset_store.open_store(directory, verify=verify)
        dataset = PreferenceDataset(max_size=manifest["metadata"].get("max_size"))
        dataset._layout = layout
        dataset._columns = columns
        dataset._fingerprint = frame_store.fingerprint_of(manifest)
        dataset._source = directory
        return dataset

    def fingerprint(self) -> str:
        """A digest of the content: pairs, preferences, every array.

        Read from the manifest for a store as loaded or saved (no data is read);
        otherwise the arrays are hashed once and the digest kept until the next
        push. Equal for a dataset, the store saved from it and that store loaded.

        Returns:
            A hexadecimal SHA-256.
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
        where = name
        if self._source is not None:
            where = str(self._source / "frames.npy")
        shape, dtype = self._layout.obs_shape, self._columns["frames"].dtype
        if tuple(space.shape) != shape or np.dtype(space.dtype) != dtype:
            raise ValueError(
                f"{where}: observations are {dtype} {shape}, but the environment's "
                f"observation space is {np.dtype(space.dtype)} {tuple(space.shape)}",
            )


def _check_alike(frag: Fragment, reference: Fragment, name: str) -> None:
    obs, ref = np.asarray(frag.obs), np.asarray(reference.obs)
    if (obs.shape[1:], obs.dtype) != (ref.shape[1:], ref.dtype):
        raise ValueError(
            f"{name} has observations {obs.dtype} {obs.shape[1:]}, but "
            f"fragments[0][0] has {ref.dtype} {ref.shape[1:]}",
        )
    acts, ref_acts = np.asarray(frag.acts), np.asarray(reference.acts)
    if (acts.shape[1:], acts.dtype) != (ref_acts.shape[1:], ref_acts.dtype):
        raise ValueError(
            f"{name} has actions {acts.dtype} {acts.shape[1:]}, but "
            f"fragments[0][0] has {ref_acts.dtype} {ref_acts.shape[1:]}",
        )


__all__: List[str] = ["PreferenceDataset"]
