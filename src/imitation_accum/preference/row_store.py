"""Rows addressed by a running id, appended at the back and dropped at the front.

A :class:`RowStore` holds the rows of one array of the frame store (frames, frame
indices, actions, ...). Rows live in segments of a fixed byte size: appending never
copies what is stored, and dropping the oldest rows frees every segment they fill
completely, so a bounded dataset keeps a bounded amount of memory. A memory-mapped
array is one read-only segment; rows appended after it go to new segments.

Rows are addressed by an id that counts every row ever appended, so ids held
elsewhere stay valid when older rows are dropped.
"""

from typing import List, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import DTypeLike

#: Bytes per segment of appended rows (pages are touched only as rows fill them).
SEGMENT_BYTES = 64 * 2**20


class RowStore:
    """Rows of one shape and dtype, addressed by a running id.

    Args:
        row_shape: Shape of one row.
        dtype: Their dtype.
        segment_bytes: Bytes per segment of appended rows (default
            :data:`SEGMENT_BYTES`).
    """

    def __init__(
        self,
        row_shape: Sequence[int],
        dtype: DTypeLike,
        segment_bytes: Optional[int] = None,
    ) -> None:
        self.row_shape: Tuple[int, ...] = tuple(int(n) for n in row_shape)
        self.dtype = np.dtype(dtype)
        row_bytes = max(1, int(np.prod(self.row_shape)) * self.dtype.itemsize)
        if segment_bytes is None:
            segment_bytes = SEGMENT_BYTES
        self._segment_rows = max(1, segment_bytes // row_bytes)
        # Segments in id order: (id of row 0, array, rows filled).
        self._segments: List[Tuple[int, np.ndarray, int]] = []
        self.first = 0
        """Id of the oldest live row."""
        self.stop = 0
        """One past the id of the newest row."""

    @classmethod
    def of_array(cls, array: np.ndarray, first: int = 0) -> "RowStore":
        """A store holding ``array`` as is (memory-mapped, say), from id ``first``."""
        store = cls(array.shape[1:], array.dtype)
        store._segments.append((first, array, len(array)))
        store.first = first
        store.stop = first + len(array)
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
        """Copies ``rows`` in at the back.

        Args:
            rows: Rows of this store's shape (cast to its dtype).

        Returns:
            The id of the first of them.
        """
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

    def blocks(self) -> List[np.ndarray]:
        """The live rows as views of consecutive blocks (for writing them out)."""
        out = []
        for start, array, filled in self._segments:
            lo = max(self.first, start) - start
            hi = min(self.stop, start + filled) - start
            if hi > lo:
                out.append(array[lo:hi])
        return out

    def to_array(self) -> np.ndarray:
        """The live rows as one new array."""
        blocks = self.blocks()
        if not blocks:
            return np.empty((0, *self.row_shape), self.dtype)
        return np.concatenate(blocks)
