"""Read-only views of a preference dataset's fragments, as imitation's lists.

imitation's ``PreferenceDataset`` keeps ``fragments1`` and ``fragments2`` as
lists; this package's dataset materializes a fragment only when it is read.
"""

from typing import Any, Iterator, List, Protocol, Sequence

from imitation.data import types

Fragment = types.Trajectory


class FragmentSource(Protocol):
    """What a view reads: pairs counted, fragments by position (2 per pair)."""

    def __len__(self) -> int:
        """Pairs held."""

    def _fragment(self, position: int) -> Fragment:
        """Fragment ``position`` (pair ``position // 2``, side ``position % 2``)."""


def position(key: Any, n: int) -> int:
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


class SideFragments(Sequence[Fragment]):
    """One side's fragments of a dataset, materialized on access."""

    def __init__(self, dataset: FragmentSource, side: int) -> None:
        self._dataset = dataset
        self._side = side

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [self[i] for i in range(len(self))[key]]
        i = position(key, len(self))
        return self._dataset._fragment(2 * i + self._side)

    def __iter__(self) -> Iterator[Fragment]:
        return (self[i] for i in range(len(self)))

    def __add__(self, other: Sequence[Fragment]) -> List[Fragment]:
        # imitation's fragments are lists; code that concatenates them keeps working.
        return [*self, *other]

    def __radd__(self, other: Sequence[Fragment]) -> List[Fragment]:
        return [*other, *self]
