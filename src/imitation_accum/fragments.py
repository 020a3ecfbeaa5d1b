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
from typing import List, Sequence, Tuple

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

    @property
    def lengths(self) -> np.ndarray:
        """Transitions per fragment."""
        return np.diff(self.offsets)

    @property
    def n_transitions(self) -> int:
        """Transitions in all fragments."""
        return int(self.offsets[-1])

    def gather(self, start: int, stop: int) -> Tuple[np.ndarray, ...]:
        """Reward-net inputs for transitions ``[start, stop)`` of the concatenation.

        Args:
            start: First transition.
            stop: One past the last transition.

        Returns:
            ``(obs, acts, next_obs, dones)`` arrays with ``stop - start`` rows; a
            fragment's last transition is ``done`` if the fragment is terminal.
        """
        offsets = self.offsets
        first = int(np.searchsorted(offsets, start, side="right")) - 1
        last = int(np.searchsorted(offsets, stop, side="left"))
        dones = self.dones[start:stop]
        frags = self.fragments[first:last]
        if start == offsets[first] and stop == offsets[last]:  # whole fragments
            frame_arrays = [types.assert_not_dictobs(f.obs) for f in frags]
            return (
                _cat([o[:-1] for o in frame_arrays]),
                _cat([f.acts for f in frags]),
                _cat([o[1:] for o in frame_arrays]),
                dones,
            )
        obs: List[np.ndarray] = []
        next_obs: List[np.ndarray] = []
        acts: List[np.ndarray] = []
        for i, frag in enumerate(frags, start=first):
            lo = max(start, int(offsets[i])) - int(offsets[i])
            hi = min(stop, int(offsets[i + 1])) - int(offsets[i])
            frag_obs = types.assert_not_dictobs(frag.obs)
            obs.append(frag_obs[lo:hi])
            next_obs.append(frag_obs[lo + 1 : hi + 1])
            acts.append(frag.acts[lo:hi])
        return _cat(obs), _cat(acts), _cat(next_obs), dones

    def discount_weights(self, discount: float) -> np.ndarray:
        """``discount ** t`` per transition, ``t`` counted from its fragment's start."""
        positions = np.arange(self.n_transitions) - np.repeat(
            self.offsets[:-1],
            self.lengths,
        )
        return np.float32(discount) ** positions.astype(np.float32)

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
        if len(lengths) and np.all(lengths == lengths[0]):
            return values.reshape(len(lengths), int(lengths[0]), *values.shape[1:]).sum(
                1
            )
        parts = th.split(values, lengths.tolist())
        return th.stack([part.sum(0) for part in parts])


def _cat(parts: List[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def pair_fragments(
    pairs: Sequence[Tuple[types.Trajectory, types.Trajectory]],
) -> List[types.Trajectory]:
    """Flattens pairs as ``[a0, b0, a1, b1, ...]`` (returns then pair up by stride)."""
    return [frag for pair in pairs for frag in pair]
