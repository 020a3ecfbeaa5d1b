"""A preference dataset read once per ``train()`` call, checked and indexed.

imitation's ``PreferenceDataset`` holds two lists of fragments and an array of
preferences; the trainers read it once per call of ``train`` into a
:class:`PreferenceTable`, which keeps the fragments as they are (no copy of any
frame) plus the per-fragment lengths and terminal flags that laying out a chunk
needs.

This package's :class:`~imitation_accum.preference.dataset.PreferenceDataset`
(or a ``Subset`` of one) is read into a :class:`StoredPreferenceTable` instead:
its layouts hold, per transition, the ids of its observation and action in the
store, and a reward-net call gathers its frames from the store's arrays with one
fancy index, without any per-fragment object.
"""

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from imitation.data import types
from torch.utils import data as data_th

from imitation_accum.preference import fragments
from imitation_accum.preference.dataset import (
    ImitationPreferenceDataset,
    PreferenceDataset,
)

Pair = Tuple[types.Trajectory, types.Trajectory]


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
        return len(self.pairs)

    def layout(self, indices: np.ndarray) -> fragments.FragmentLayout:
        """The fragments of pairs ``indices`` laid end to end, ``[a0, b0, a1, ...]``."""
        return self._laid_out(indices, [0, 1])

    def side_layout(
        self,
        indices: np.ndarray,
        side: int,
    ) -> fragments.FragmentLayout:
        """The ``side`` fragments (0: first, 1: second) of pairs ``indices``."""
        return self._laid_out(indices, [side])

    def _laid_out(
        self, indices: np.ndarray, sides: List[int]
    ) -> fragments.FragmentLayout:
        """Fragments ``sides`` of each pair ``indices`` end to end, pair by pair."""
        return fragments.FragmentLayout.from_arrays(
            [self.pairs[i][side] for i in indices for side in sides],
            self.lengths[indices][:, sides].reshape(-1),
            self.terminal[indices][:, sides].reshape(-1),
        )

    def fragments(self, indices: Sequence[int]) -> List[types.Trajectory]:
        """The fragments of pairs ``indices``, ``[a0, b0, a1, ...]``."""
        return [frag for i in indices for frag in self.pairs[i]]

    def rewards(self) -> Optional[np.ndarray]:
        """Every transition's reward, fragments ``[a0, b0, a1, ...]`` end to end.

        Returns:
            The rewards, or ``None`` if some fragment has none.
        """
        frags = self.fragments(range(len(self)))
        if not all(isinstance(f, types.TrajectoryWithRew) for f in frags):
            return None
        return np.concatenate([f.rews for f in frags])  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class StoredLayout(fragments.FragmentLayout):
    """A layout of fragments kept in a frame store (``fragments`` is empty)."""

    store: PreferenceDataset
    obs_ids: np.ndarray
    """Per transition of the concatenation: its observation's id in the store."""
    transition_ids: np.ndarray
    """Per transition: its action's (and reward's) id in the store."""

    @classmethod
    def of_index(cls, store: PreferenceDataset, index: np.ndarray) -> "StoredLayout":
        """Lays out the fragments of ``index`` rows (``fragment_index``'s columns)."""
        lengths, terminal = index[:, 2], index[:, 3].astype(bool)
        base = fragments.FragmentLayout.from_arrays((), lengths, terminal)
        positions = base.positions()
        return cls(
            (),
            base.offsets,
            base.dones,
            store,
            np.repeat(index[:, 0], lengths) + positions,
            np.repeat(index[:, 1], lengths) + positions,
        )

    def gather(
        self,
        start: int,
        stop: int,
        next_obs: bool = True,
    ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], np.ndarray]:
        """As :meth:`FragmentLayout.gather`, read from the store.

        The frames of ``obs`` and ``next_obs`` are gathered together (one fancy
        index into the frames) and stacked into one contiguous array.
        """
        ids = self.obs_ids[start:stop]
        n = len(ids)
        if next_obs:
            both = self.store.observations_at(np.concatenate([ids, ids + 1]))
            obs, nxt = both[:n], both[n:]
        else:
            obs, nxt = self.store.observations_at(ids), None
        acts = self.store.actions_at(self.transition_ids[start:stop])
        return obs, acts, nxt, self.dones[start:stop]


@dataclasses.dataclass(frozen=True)
class StoredPreferenceTable(PreferenceTable):
    """The pairs of a frame store; ``pairs`` materializes fragments on access."""

    store: PreferenceDataset
    index: np.ndarray
    """Per pair and side, the store's fragment index row, shape ``(n, 2, 6)``."""

    def _laid_out(
        self, indices: np.ndarray, sides: List[int]
    ) -> fragments.FragmentLayout:
        rows = self.index[indices][:, sides].reshape(-1, 6)
        return StoredLayout.of_index(self.store, rows)

    def rewards(self) -> Optional[np.ndarray]:
        """Every transition's reward, fragments ``[a0, b0, a1, ...]`` end to end."""
        if not self.index[..., 5].all():
            return None
        layout = StoredLayout.of_index(self.store, self.index.reshape(-1, 6))
        return self.store.rewards_at(layout.transition_ids)


class _StoredPairs(Sequence[Pair]):
    """Pairs ``selection`` of a store, materialized on access (the first one kept)."""

    def __init__(self, store: PreferenceDataset, selection: np.ndarray) -> None:
        self._store = store
        self._selection = selection
        self._first: Optional[Pair] = None

    def __len__(self) -> int:
        return len(self._selection)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return [self[i] for i in range(len(self))[key]]
        if key == 0:
            if self._first is None:
                self._first = self._store[int(self._selection[0])][0]
            return self._first
        return self._store[int(self._selection[key])][0]


def _read_store(dataset: PreferenceDataset, selection: np.ndarray) -> PreferenceTable:
    if not len(selection):
        raise ValueError("dataset is empty: gather some preferences before training")
    all_prefs = dataset.preferences.astype(np.float32)
    index = dataset.fragment_index(selection)
    return StoredPreferenceTable(
        _StoredPairs(dataset, selection),
        all_prefs[selection],
        index[..., 2].copy(),
        index[..., 3].astype(bool),
        dataset,
        index,
    )


def read_preferences(dataset: data_th.Dataset) -> PreferenceTable:
    """Reads and checks ``dataset``.

    Args:
        dataset: A ``PreferenceDataset``, or any dataset whose items are
            ``((fragment_a, fragment_b), preference)`` (such as a ``Subset``).

    Returns:
        The dataset's table.

    Raises:
        ValueError: if the dataset is empty, a preference lies outside ``[0, 1]``,
            observations are dictionaries or a fragment has no transitions.
    """
    if isinstance(dataset, PreferenceDataset):
        return _read_store(dataset, np.arange(len(dataset)))
    if isinstance(dataset, data_th.Subset) and isinstance(
        dataset.dataset,
        PreferenceDataset,
    ):
        return _read_store(dataset.dataset, np.asarray(dataset.indices, np.int64))
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        raise ValueError("dataset is empty: gather some preferences before training")
    if isinstance(dataset, ImitationPreferenceDataset):
        pairs: List[Pair] = list(zip(dataset.fragments1, dataset.fragments2))
        prefs = np.asarray(dataset.preferences, dtype=np.float32)
    else:
        items = [dataset[i] for i in range(n)]
        pairs = [(item[0][0], item[0][1]) for item in items]
        prefs = np.asarray([item[1] for item in items], dtype=np.float32)
    bad = np.flatnonzero(~((prefs >= 0) & (prefs <= 1)))
    if len(bad):
        raise ValueError(
            f"preferences must lie in [0, 1]; dataset item {bad[0]} has "
            f"{prefs[bad[0]]}",
        )
    if isinstance(pairs[0][0].obs, types.DictObs):
        raise ValueError("dictionary observations are not supported")
    lengths = np.array([[len(a.acts), len(b.acts)] for a, b in pairs], dtype=np.int64)
    if (lengths < 1).any():
        item = int(np.flatnonzero((lengths < 1).any(1))[0])
        raise ValueError(f"dataset item {item} has a fragment with no transitions")
    terminal = np.array([[a.terminal, b.terminal] for a, b in pairs], dtype=bool)
    return PreferenceTable(pairs, prefs, lengths, terminal)
