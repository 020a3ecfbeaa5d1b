"""A preference dataset read for training: its pairs, and fragments laid end to end.

Each ``train()`` reads its dataset once into a :class:`PreferenceTable` (no frame
copied). A chunk's fragments are laid end to end without padding (they may differ
in length) as a :class:`FragmentLayout`: a reward-net call takes any run of its
transitions, and rewards are summed back into per-fragment returns. A frame store
(this package's ``PreferenceDataset``) is read into a :class:`StoredPreferenceTable`,
whose layouts gather frames from the store's arrays by id.
"""

import dataclasses
import functools
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch as th
from imitation.data import types
from torch.utils import data as data_th

from imitation_accum.preference.dataset import (
    N_COLUMNS,
    Column,
    ImitationPreferenceDataset,
    PreferenceDataset,
)

Pair = Tuple[types.Trajectory, types.Trajectory]
Inputs = Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class FragmentLayout:
    """Fragments laid end to end.

    Observations are gathered as stored (uint8 frames stay uint8); ``obs[t + 1]``
    is sliced from the fragment's own observations, never copied beforehand.

    Attributes:
        fragments: The fragments, in concatenation order.
        offsets: ``offsets[i]`` is the index of fragment ``i``'s first transition;
            ``offsets[-1]`` is the total number of transitions.
        dones: Per transition: the last one of a terminal fragment.
    """

    fragments: Sequence[types.Trajectory]
    offsets: np.ndarray
    dones: np.ndarray

    @classmethod
    def of(cls, fragments: Sequence[types.Trajectory]) -> "FragmentLayout":
        """Lays ``fragments`` end to end."""
        lengths = np.fromiter((len(f.acts) for f in fragments), dtype=np.int64)
        terminal = np.fromiter((f.terminal for f in fragments), dtype=bool)
        return cls.from_arrays(fragments, lengths, terminal)

    @classmethod
    def from_arrays(
        cls,
        fragments: Sequence[types.Trajectory],
        lengths: np.ndarray,
        terminal: np.ndarray,
    ) -> "FragmentLayout":
        """Lays ``fragments`` end to end, given their lengths and terminal flags."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        dones = np.zeros(offsets[-1], dtype=bool)
        dones[offsets[1:][terminal] - 1] = True
        return cls(fragments, offsets, dones)

    # Cached: read on every chunk, and a cached placement's layouts serve step
    # after step; derived afresh they were a visible share of a small net's step.
    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """Transitions per fragment."""
        return np.diff(self.offsets)

    @functools.cached_property
    def uniform_length(self) -> Optional[int]:
        """The length all fragments share, or ``None`` if they differ."""
        lengths = self.lengths
        if len(lengths) and (lengths == lengths[0]).all():
            return int(lengths[0])
        return None

    @property
    def n_transitions(self) -> int:
        """Transitions in all fragments."""
        return int(self.offsets[-1])

    def positions(self) -> np.ndarray:
        """Per transition, its index within its fragment."""
        return np.arange(self.n_transitions) - np.repeat(
            self.offsets[:-1], self.lengths
        )

    def gather(self, start: int, stop: int, next_obs: bool = True) -> Inputs:
        """Reward-net inputs ``(obs, acts, next_obs, dones)`` of ``[start, stop)``.

        ``next_obs`` is ``None`` unless asked for; a fragment's last transition
        is ``done`` if the fragment is terminal.
        """
        first, sizes = self.pieces(start, stop)
        frags = self.fragments[first : first + len(sizes)]
        los = np.maximum(start - self.offsets[first : first + len(sizes)], 0)
        bounds = [(int(lo), int(lo + n)) for lo, n in zip(los, sizes)]
        # Dictionary observations are refused when a dataset is read.
        frames: List[np.ndarray] = [f.obs for f in frags]  # type: ignore[misc]
        return (
            _cat([o[lo:hi] for o, (lo, hi) in zip(frames, bounds)]),
            _cat([f.acts[lo:hi] for f, (lo, hi) in zip(frags, bounds)]),
            (
                _cat([o[lo + 1 : hi + 1] for o, (lo, hi) in zip(frames, bounds)])
                if next_obs
                else None
            ),
            self.dones[start:stop],
        )

    def discount_weights(self, discount: float) -> np.ndarray:
        """``discount ** t`` per transition, ``t`` counted from its fragment's start."""
        return np.float32(discount) ** self.positions().astype(np.float32)

    def segment_sums(self, values: th.Tensor) -> th.Tensor:
        """Sums ``values`` (one row per transition) over each fragment.

        Deterministic on every device (no atomics): equal lengths reshape,
        unequal lengths split.
        """
        lengths = self.lengths
        if self.uniform_length is not None:
            shape = (len(lengths), self.uniform_length, *values.shape[1:])
            return values.reshape(shape).sum(1)
        return th.stack([part.sum(0) for part in th.split(values, lengths.tolist())])

    def pieces(self, start: int, stop: int) -> Tuple[int, np.ndarray]:
        """The fragments that transitions ``[start, stop)`` overlap.

        Returns:
            The first fragment's index and the range's transitions per fragment.
        """
        offsets = self.offsets
        first = int(np.searchsorted(offsets, start, side="right")) - 1
        last = int(np.searchsorted(offsets, stop, side="left"))
        return first, np.diff(np.clip(offsets[first : last + 1], start, stop))

    def range_sums(self, values: th.Tensor, start: int, stop: int) -> th.Tensor:
        """Sums ``values`` of transitions ``[start, stop)`` into every fragment.

        Fragments outside the range get zero, so the sums of ranges that tile the
        concatenation add up to :meth:`segment_sums`.
        """
        first, lengths = self.pieces(start, stop)
        sums = [part.sum(0) for part in th.split(values, lengths.tolist())]
        n_after = len(self.offsets) - 1 - first - len(sums)
        return th.cat(
            [values.new_zeros(first), th.stack(sums), values.new_zeros(n_after)]
        )


def _cat(parts: List[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclasses.dataclass(frozen=True)
class StoredLayout(FragmentLayout):
    """A layout of fragments kept in a frame store (``fragments`` is empty).

    Attributes:
        obs_ids: Per transition, its observation's id in the store.
        transition_ids: Per transition, its action's (and reward's) id.
    """

    store: PreferenceDataset
    obs_ids: np.ndarray
    transition_ids: np.ndarray

    @classmethod
    def of_index(cls, store: PreferenceDataset, index: np.ndarray) -> "StoredLayout":
        """Lays out the fragments of ``index`` rows (:class:`Column`)."""
        lengths = index[:, Column.LENGTH]
        terminal = index[:, Column.TERMINAL].astype(bool)
        base = FragmentLayout.from_arrays((), lengths, terminal)
        positions = base.positions()
        return cls(
            (),
            base.offsets,
            base.dones,
            store,
            np.repeat(index[:, Column.OBS], lengths) + positions,
            np.repeat(index[:, Column.TRANSITION], lengths) + positions,
        )

    def gather(self, start: int, stop: int, next_obs: bool = True) -> Inputs:
        """As :meth:`FragmentLayout.gather`: ``obs`` and ``next_obs`` in one gather."""
        ids = self.obs_ids[start:stop]
        if next_obs:
            both = self.store.observations_at(np.concatenate([ids, ids + 1]))
            obs, nxt = both[: len(ids)], both[len(ids) :]
        else:
            obs, nxt = self.store.observations_at(ids), None
        acts = self.store.actions_at(self.transition_ids[start:stop])
        return obs, acts, nxt, self.dones[start:stop]


@dataclasses.dataclass(frozen=True)
class PreferenceTable:
    """Pairs, preferences and fragment metadata of a dataset.

    Attributes:
        pairs: The fragment pairs, in dataset order.
        preferences: Probability that each pair's first fragment is preferred.
        lengths: Transitions per fragment, shape ``(n_pairs, 2)``.
        terminal: Whether each fragment ends its episode, shape ``(n_pairs, 2)``.
    """

    pairs: Sequence[Pair]
    preferences: np.ndarray
    lengths: np.ndarray
    terminal: np.ndarray

    def __len__(self) -> int:
        return len(self.preferences)

    def first_obs(self) -> np.ndarray:
        """The first observation(s) of the first fragment (shape and dtype)."""
        return np.asarray(self.pairs[0][0].obs)

    def layout(self, indices: np.ndarray) -> FragmentLayout:
        """The fragments of pairs ``indices`` laid end to end, ``[a0, b0, a1, ...]``."""
        return self._laid_out(indices, [0, 1])

    def side_layout(self, indices: np.ndarray, side: int) -> FragmentLayout:
        """The ``side`` fragments (0: first, 1: second) of pairs ``indices``."""
        return self._laid_out(indices, [side])

    def _laid_out(self, indices: np.ndarray, sides: List[int]) -> FragmentLayout:
        return FragmentLayout.from_arrays(
            [self.pairs[i][side] for i in indices for side in sides],
            self.lengths[indices][:, sides].reshape(-1),
            self.terminal[indices][:, sides].reshape(-1),
        )

    def rewards(self) -> Optional[np.ndarray]:
        """Every transition's reward, fragments ``[a0, b0, a1, ...]`` end to end.

        Returns:
            The rewards, or ``None`` if some fragment has none.
        """
        frags = [frag for pair in self.pairs for frag in pair]
        if not all(isinstance(f, types.TrajectoryWithRew) for f in frags):
            return None
        return np.concatenate([f.rews for f in frags])  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class StoredPreferenceTable(PreferenceTable):
    """The pairs of a frame store (``pairs`` is empty: layouts read the store).

    Attributes:
        index: Per pair and side, the store's index row (:class:`Column`).
    """

    store: PreferenceDataset
    index: np.ndarray

    def first_obs(self) -> np.ndarray:
        """The first observation of the first fragment (shape and dtype)."""
        return self.store.observations_at(self.index[0, 0, [Column.OBS]])

    def _laid_out(self, indices: np.ndarray, sides: List[int]) -> FragmentLayout:
        rows = self.index[indices][:, sides].reshape(-1, N_COLUMNS)
        return StoredLayout.of_index(self.store, rows)

    def rewards(self) -> Optional[np.ndarray]:
        """Every transition's reward, fragments ``[a0, b0, a1, ...]`` end to end."""
        if not self.index[..., Column.HAS_REWARDS].all():
            return None
        rows = self.index.reshape(-1, N_COLUMNS)
        layout = StoredLayout.of_index(self.store, rows)
        return self.store.rewards_at(layout.transition_ids)


def _read_store(dataset: PreferenceDataset, selection: np.ndarray) -> PreferenceTable:
    index = dataset.fragment_index(selection)
    return StoredPreferenceTable(
        (),
        dataset.preferences.astype(np.float32)[selection],
        index[..., Column.LENGTH].copy(),
        index[..., Column.TERMINAL].astype(bool),
        dataset,
        index,
    )


def read_preferences(dataset: data_th.Dataset) -> PreferenceTable:
    """Reads ``dataset``, checked by :mod:`~imitation_accum.preference.dataset_checks`.

    Args:
        dataset: A ``PreferenceDataset``, or any dataset whose items are
            ``((fragment_a, fragment_b), preference)`` (such as a ``Subset``).

    Returns:
        The dataset's table.
    """
    if isinstance(dataset, PreferenceDataset):
        return _read_store(dataset, np.arange(len(dataset)))
    if isinstance(dataset, data_th.Subset) and isinstance(
        dataset.dataset, PreferenceDataset
    ):
        return _read_store(dataset.dataset, np.asarray(dataset.indices, np.int64))
    if isinstance(dataset, ImitationPreferenceDataset):
        pairs: List[Pair] = list(zip(dataset.fragments1, dataset.fragments2))
        prefs = np.asarray(dataset.preferences, dtype=np.float32)
    else:
        items = [dataset[i] for i in range(len(dataset))]  # type: ignore[arg-type]
        pairs = [(item[0][0], item[0][1]) for item in items]
        prefs = np.asarray([item[1] for item in items], dtype=np.float32)
    lengths = np.array([[len(a.acts), len(b.acts)] for a, b in pairs], dtype=np.int64)
    terminal = np.array([[a.terminal, b.terminal] for a, b in pairs], dtype=bool)
    return PreferenceTable(pairs, prefs, lengths, terminal)
