"""Fragments of a chunk laid end to end.

Gathers reward-net inputs and sums per-transition rewards back into per-fragment
returns.
The transitions of all fragments of a chunk are concatenated without padding
(fragments may differ in length). A reward-net call takes any run of consecutive
transitions, possibly spanning fragments; observations are gathered as stored
(uint8 frames stay uint8) and converted on the device by the net's ``preprocess``.
``obs[t]`` and ``obs[t + 1]`` are sliced from the fragment's own observation array,
never copied into a separate next-observation store.
"""

import dataclasses
import functools
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch as th
from imitation.data import types


@dataclasses.dataclass(frozen=True)
class FragmentLayout:
    """Where each fragment's transitions sit in a chunk's concatenation.

    Attributes:
        fragments: The fragments, in concatenation order.
        offsets: ``offsets[i]`` is the index of fragment ``i``'s first transition;
            ``offsets[-1]`` is the total number of transitions.
    """

    fragments: Sequence[types.Trajectory]
    offsets: np.ndarray
    dones: np.ndarray
    """Per transition: the last one of a terminal fragment."""

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

    # Cached: segment_sums reads both for each side of each chunk, and a cached
    # placement's layouts serve step after step (pair_task.ConvertedBatches);
    # derived afresh they took about 15 us a read (np.diff and a compare on a
    # 2-core CPU), a visible share of a small net's step.
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
            self.offsets[:-1],
            self.lengths,
        )

    def gather(
        self,
        start: int,
        stop: int,
        next_obs: bool = True,
    ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], np.ndarray]:
        """Reward-net inputs for transitions ``[start, stop)`` of the concatenation.

        Args:
            start: First transition.
            stop: One past the last transition.
            next_obs: Whether to gather next observations (``None`` if not).

        Returns:
            ``(obs, acts, next_obs, dones)`` arrays with ``stop - start`` rows; a
            fragment's last transition is ``done`` if the fragment is terminal.
        """
        offsets = self.offsets
        first = int(np.searchsorted(offsets, start, side="right")) - 1
        last = int(np.searchsorted(offsets, stop, side="left"))
        dones = self.dones[start:stop]
        frags = self.fragments[first:last]
        # Dictionary observations are refused when a dataset is read.
        frames: List[np.ndarray] = [f.obs for f in frags]  # type: ignore[misc]
        if start == offsets[first] and stop == offsets[last]:  # whole fragments
            return (
                _cat([o[:-1] for o in frames]),
                _cat([f.acts for f in frags]),
                _cat([o[1:] for o in frames]) if next_obs else None,
                dones,
            )
        bounds = [
            (
                max(start, int(offsets[i])) - int(offsets[i]),
                min(stop, int(offsets[i + 1])) - int(offsets[i]),
            )
            for i in range(first, last)
        ]
        acts = [f.acts[lo:hi] for f, (lo, hi) in zip(frags, bounds)]
        return (
            _cat([o[lo:hi] for o, (lo, hi) in zip(frames, bounds)]),
            _cat(acts),
            (
                _cat([o[lo + 1 : hi + 1] for o, (lo, hi) in zip(frames, bounds)])
                if next_obs
                else None
            ),
            dones,
        )

    def discount_weights(self, discount: float) -> np.ndarray:
        """``discount ** t`` per transition, ``t`` counted from its fragment's start."""
        return np.float32(discount) ** self.positions().astype(np.float32)

    def segment_sums(self, values: th.Tensor) -> th.Tensor:
        """Sums ``values`` (one per transition) over each fragment.

        Deterministic on every device (no atomics): equal lengths reshape, unequal
        lengths split.

        Args:
            values: Shape ``(n_transitions,)`` or ``(n_transitions, k)``.

        Returns:
            Shape ``(n_fragments,)`` or ``(n_fragments, k)``.
        """
        lengths = self.lengths
        if self.uniform_length is not None:
            shape = (len(lengths), self.uniform_length, *values.shape[1:])
            return values.reshape(shape).sum(1)
        parts = th.split(values, lengths.tolist())
        return th.stack([part.sum(0) for part in parts])

    def pieces(self, start: int, stop: int) -> Tuple[int, np.ndarray]:
        """The fragments that transitions ``[start, stop)`` overlap.

        Args:
            start: First transition.
            stop: One past the last transition (``stop > start``).

        Returns:
            The index of the first fragment overlapped, and the number of the
            range's transitions in each overlapped fragment, in order.
        """
        offsets = self.offsets
        first = int(np.searchsorted(offsets, start, side="right")) - 1
        last = int(np.searchsorted(offsets, stop, side="left"))
        bounds = np.clip(offsets[first : last + 1], start, stop)
        return first, np.diff(bounds)

    def range_sums(self, values: th.Tensor, start: int, stop: int) -> th.Tensor:
        """Sums ``values`` of transitions ``[start, stop)`` into every fragment.

        A range may start or end inside a fragment: each fragment gets the sum of
        its transitions inside the range, and fragments outside it get zero, so
        the sums of ranges that tile the concatenation add up to
        :meth:`segment_sums`.

        Args:
            values: One value per transition of the range, shape ``(stop - start,)``.
            start: First transition.
            stop: One past the last transition.

        Returns:
            Shape ``(n_fragments,)``.
        """
        first, lengths = self.pieces(start, stop)
        sums = [part.sum(0) for part in th.split(values, lengths.tolist())]
        n_after = len(self.offsets) - 1 - first - len(sums)
        return th.cat(
            [
                values.new_zeros(first),
                th.stack(sums),
                values.new_zeros(n_after),
            ],
        )


def _cat(parts: List[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
