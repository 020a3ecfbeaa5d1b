"""A preference dataset read once per ``train()`` call, checked and indexed.

imitation's ``PreferenceDataset`` holds two lists of fragments and an array of
preferences; the trainers read it once per call of ``train`` into a
:class:`PreferenceTable`, which keeps the fragments as they are (no copy of any
frame) plus the per-fragment lengths and terminal flags that laying out a chunk
needs.
"""

import dataclasses
from typing import List, Sequence, Tuple

import numpy as np
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from torch.utils import data as data_th

from imitation_accum.preference import fragments

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
        frags = [frag for i in indices for frag in self.pairs[i]]
        return fragments.FragmentLayout.from_arrays(
            frags,
            self.lengths[indices].reshape(-1),
            self.terminal[indices].reshape(-1),
        )

    def side_layout(self, indices: np.ndarray, side: int) -> fragments.FragmentLayout:
        """The ``side`` fragments (0: first, 1: second) of pairs ``indices``."""
        return fragments.FragmentLayout.from_arrays(
            [self.pairs[i][side] for i in indices],
            self.lengths[indices, side],
            self.terminal[indices, side],
        )

    def fragments(self, indices: Sequence[int]) -> List[types.Trajectory]:
        """The fragments of pairs ``indices``, ``[a0, b0, a1, ...]``."""
        return [frag for i in indices for frag in self.pairs[i]]


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
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        raise ValueError("dataset is empty: gather some preferences before training")
    if isinstance(dataset, pc.PreferenceDataset):
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
