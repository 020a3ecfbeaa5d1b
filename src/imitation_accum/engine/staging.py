"""Chunk inputs on their way to the device, the next chunk's during this one's compute.

On CUDA arrays go through page-locked buffers on a side stream; elsewhere they become
tensors at once. Arrays keep their dtype (``uint8`` frames stay ``uint8``).
"""

import dataclasses
from typing import (
    Callable,
    Dict,
    Generic,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

import numpy as np
import torch as th
from imitation.util import util

ChunkT = TypeVar("ChunkT")
HostArray = Union[np.ndarray, th.Tensor]
MaybeArrays = Sequence[Optional[HostArray]]
MaybeTensors = List[Optional[th.Tensor]]


@dataclasses.dataclass
class Pending:
    """A copy under way: its destination tensors and what marks its end."""

    tensors: MaybeTensors
    event: Optional[object] = None
    """A ``torch.cuda.Event`` recorded after the copy (``None``: already done)."""


class Transport(Protocol):
    """How host arrays reach the device."""

    def send(self, arrays: MaybeArrays) -> Pending:
        """Starts moving ``arrays`` (``None`` entries stay ``None``)."""

    def wait(self, pending: Pending) -> MaybeTensors:
        """The tensors of ``pending``, usable on the current stream."""


class CudaTransport:
    """Copies through two page-locked buffers, used in turn, on a side CUDA stream.

    Targets are allocated on the compute stream: the allocator never reuses them early.

    Args:
        device: The CUDA device.
    """

    n_slots = 2

    def __init__(self, device: th.device) -> None:
        self.device = device
        self.stream = th.cuda.Stream(device)
        self._buffers: List[Dict[int, th.Tensor]] = [{} for _ in range(self.n_slots)]
        self._last_copy: List[Optional[th.cuda.Event]] = [None] * self.n_slots
        self._slot = 0

    def _pinned(self, slot: int, index: int, array: HostArray) -> th.Tensor:
        """``array`` copied into slot ``slot``'s page-locked buffer ``index``."""
        if isinstance(array, th.Tensor):
            array = array.numpy()
        buffer = self._buffers[slot].get(index)
        if buffer is None or buffer.numel() < max(array.nbytes, 1):
            buffer = th.empty(max(array.nbytes, 1), dtype=th.uint8, pin_memory=True)
            self._buffers[slot][index] = buffer
        host = buffer[: array.nbytes].numpy().view(array.dtype).reshape(array.shape)
        np.copyto(host, array)
        return th.from_numpy(host)

    def send(self, arrays: MaybeArrays) -> Pending:
        """Starts the copy of ``arrays`` on the side stream."""
        slot = self._slot
        self._slot = (slot + 1) % self.n_slots
        last = self._last_copy[slot]
        if last is not None:
            last.synchronize()  # the buffer's previous copy has left it
        pairs: List[Optional[Tuple[th.Tensor, th.Tensor]]] = []
        for index, array in enumerate(arrays):
            if array is None:
                pairs.append(None)
                continue
            if isinstance(array, th.Tensor) and array.is_pinned():
                source = array
            else:
                source = self._pinned(slot, index, array)
            target = th.empty(source.shape, dtype=source.dtype, device=self.device)
            pairs.append((source, target))
        # The targets' allocation on the compute stream comes first.
        self.stream.wait_stream(th.cuda.current_stream(self.device))
        with th.cuda.stream(self.stream):
            for pair in pairs:
                if pair is not None:
                    pair[1].copy_(pair[0], non_blocking=True)
            event = th.cuda.Event()
            event.record(self.stream)
        self._last_copy[slot] = event
        return Pending([None if p is None else p[1] for p in pairs], event)

    def wait(self, pending: Pending) -> MaybeTensors:
        """Makes the compute stream wait for the copy; the tensors."""
        if pending.event is not None:
            th.cuda.current_stream(self.device).wait_event(pending.event)  # type: ignore[arg-type]
        return pending.tensors


class Stager(Generic[ChunkT]):
    """Moves each chunk's host arrays to the device, one chunk ahead.

    Args:
        transport: How arrays reach the device (default: :class:`CudaTransport`
            on CUDA; elsewhere arrays become tensors when fetched).
    """

    def __init__(self, transport: Optional[Transport] = None) -> None:
        self._fixed_transport = transport
        self.transport: Optional[Transport] = transport
        self._device: Optional[th.device] = None
        self._host_arrays: Optional[Callable[[ChunkT], MaybeArrays]] = None
        self._chunks: List[ChunkT] = []  # keeps the ids below valid
        self._following: Dict[int, ChunkT] = {}
        self._pending: Dict[int, Pending] = {}

    def schedule(
        self,
        chunks: Sequence[ChunkT],
        host_arrays: Callable[[ChunkT], MaybeArrays],
        device: th.device,
    ) -> None:
        """Sets a step's chunks, in fetch order, and ``host_arrays(chunk)``'s arrays.

        Copies under way for an earlier schedule are waited for and dropped.
        """
        if self.transport is not None:
            for pending in self._pending.values():
                self.transport.wait(pending)
        if self._fixed_transport is None and device != self._device:
            cuda = device.type == "cuda"
            self.transport = CudaTransport(device) if cuda else None
        self._device = device
        self._host_arrays = host_arrays
        self._chunks = list(chunks)
        self._following = {id(a): b for a, b in zip(self._chunks, self._chunks[1:])}
        self._pending = {}

    def fetch(self, chunk: ChunkT) -> MaybeTensors:
        """``chunk``'s arrays on the device (copied again if fetched again)."""
        assert self._host_arrays is not None, "schedule() the chunks first"
        if self.transport is None:
            return [
                None if a is None else util.safe_to_tensor(a).to(self._device)
                for a in self._host_arrays(chunk)
            ]
        pending = self._pending.pop(id(chunk), None)
        if pending is None:
            pending = self.transport.send(self._host_arrays(chunk))
        tensors = self.transport.wait(pending)
        following = self._following.get(id(chunk))
        if following is not None and id(following) not in self._pending:
            self._pending[id(following)] = self.transport.send(
                self._host_arrays(following)
            )
        return tensors


class RowSource(Protocol):
    """What a reward-net call gathers its inputs from (a ``FragmentLayout``)."""

    @property
    def n_transitions(self) -> int:
        """Transitions in the source."""

    def gather(
        self, start: int, stop: int, next_obs: bool = True
    ) -> Tuple[HostArray, HostArray, Optional[HostArray], HostArray]:
        """``(obs, acts, next_obs, dones)`` of transitions ``[start, stop)``."""


@dataclasses.dataclass
class StagedRows:
    """A layout's transitions from ``offset`` on, on the device; gathers by slicing."""

    fields: Tuple[th.Tensor, th.Tensor, Optional[th.Tensor], th.Tensor]
    offset: int
    n_transitions: int
    """Transitions of the whole layout."""

    def gather(
        self, start: int, stop: int, next_obs: bool = True
    ) -> Tuple[th.Tensor, th.Tensor, Optional[th.Tensor], th.Tensor]:
        """``(obs, acts, next_obs, dones)`` of transitions ``[start, stop)``."""
        obs, acts, next_frames, dones = self.fields
        if next_obs and next_frames is None:
            raise ValueError("next observations were not staged")
        rows = slice(start - self.offset, stop - self.offset)
        staged_next = (
            next_frames[rows] if next_obs and next_frames is not None else None
        )
        return obs[rows], acts[rows], staged_next, dones[rows]


#: A chunk's transition ranges: ``(source, start, stop)`` each.
Ranges = Sequence[Tuple[RowSource, int, int]]


def range_arrays(ranges: Ranges, *, next_obs: bool) -> MaybeArrays:
    """The host arrays of ``ranges``, four per range (a :class:`Stager`'s input)."""
    return [
        array
        for source, start, stop in ranges
        for array in source.gather(start, stop, next_obs=next_obs)
    ]


def staged_rows(ranges: Ranges, tensors: MaybeTensors) -> List[StagedRows]:
    """``ranges`` on the device from their fetched :func:`range_arrays`."""
    return [
        StagedRows(tuple(tensors[4 * k : 4 * k + 4]), start, source.n_transitions)  # type: ignore[arg-type]
        for k, (source, start, _) in enumerate(ranges)
    ]
