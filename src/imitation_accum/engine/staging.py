"""Chunk inputs on their way to the device, the next chunk's during this one's compute.

A :class:`Stager` is given a step's chunks in order (:meth:`Stager.schedule`) and a
function that lists each chunk's host arrays. :meth:`Stager.fetch` returns a
chunk's arrays on the device and, before it returns, starts the copy of the next
chunk's, so that the copy of chunk ``k + 1`` runs while chunk ``k`` computes:

- on CUDA (:class:`CudaTransport`), arrays are copied into a page-locked host
  buffer (two of them, used in turn, each reused once its last copy is done;
  arrays already page-locked go as they are) and from there to the device with
  ``non_blocking=True`` on a side stream; the compute stream waits for that copy
  only when it uses the chunk. Destination tensors are allocated on the compute
  stream, so the caching allocator never hands their memory out early.
- anywhere else (:class:`HostTransport`), arrays become tensors on the device at
  once: a pass-through with the same values.

Arrays keep their dtype: ``uint8`` frames stay ``uint8`` until the device, where the
reward net's ``preprocess`` converts them.

:class:`RangeStager` does the same for chunks made of transition ranges of
fragment layouts (preference pairs): a range is gathered once, moved, and handed
back as :class:`StagedRows`, which slices it on the device as a layout would.
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


def _as_tensor(array: HostArray) -> th.Tensor:
    return util.safe_to_tensor(array)


class HostTransport:
    """Arrays to tensors on ``device`` at once, synchronously (CPU: no copy)."""

    def __init__(self, device: th.device) -> None:
        self.device = device

    def send(self, arrays: MaybeArrays) -> Pending:
        """Converts ``arrays`` now."""
        return Pending(
            [None if a is None else _as_tensor(a).to(self.device) for a in arrays],
        )

    def wait(self, pending: Pending) -> MaybeTensors:
        """The tensors, ready."""
        return pending.tensors


class CudaTransport:
    """Copies through page-locked buffers on a side CUDA stream.

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
        nbytes = max(array.nbytes, 1)
        buffer = self._buffers[slot].get(index)
        if buffer is None or buffer.numel() < nbytes:
            buffer = th.empty(nbytes, dtype=th.uint8, pin_memory=True)
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
        compute = th.cuda.current_stream(self.device)
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
        self.stream.wait_stream(compute)  # the targets' allocation comes first
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


def transport_for(device: th.device) -> Transport:
    """The transport to ``device``: through pinned buffers on CUDA."""
    if device.type == "cuda":
        return CudaTransport(device)
    return HostTransport(device)


class Stager(Generic[ChunkT]):
    """Moves each chunk's host arrays to the device, one chunk ahead.

    Args:
        transport: How arrays reach the device; by default chosen per device at
            :meth:`schedule` (:func:`transport_for`).

    Example:
        >>> stager = Stager()  # doctest: +SKIP
        >>> stager.schedule(chunks, lambda c: [c.obs, c.acts], device)  # doctest: +SKIP
        >>> for chunk in chunks:  # doctest: +SKIP
        ...     obs, acts = stager.fetch(chunk)  # the next chunk is on its way
    """

    def __init__(self, transport: Optional[Transport] = None) -> None:
        self._fixed_transport = transport
        self._transports: Dict[th.device, Transport] = {}
        self.transport: Optional[Transport] = transport
        self._host_arrays: Optional[Callable[[ChunkT], MaybeArrays]] = None
        self._chunks: List[ChunkT] = []
        self._following: Dict[int, ChunkT] = {}
        self._pending: Dict[int, Pending] = {}

    def schedule(
        self,
        chunks: Sequence[ChunkT],
        host_arrays: Callable[[ChunkT], MaybeArrays],
        device: th.device,
    ) -> None:
        """Sets the chunks of a step, in the order they will be fetched.

        Copies under way for an earlier schedule are dropped, once the compute
        stream has waited for them (their memory may then be reused safely).

        Args:
            chunks: The step's chunks.
            host_arrays: A chunk's host arrays (``None`` entries are kept).
            device: Where the arrays go.
        """
        if self.transport is not None:
            for pending in self._pending.values():
                self.transport.wait(pending)
        if self._fixed_transport is None:
            if device not in self._transports:
                self._transports[device] = transport_for(device)
            self.transport = self._transports[device]
        self._host_arrays = host_arrays
        self._chunks = list(chunks)  # keeps the ids below valid
        self._following = {
            id(chunk): following
            for chunk, following in zip(self._chunks, self._chunks[1:])
        }
        self._pending = {}

    def _send(self, chunk: ChunkT) -> Pending:
        assert self.transport is not None and self._host_arrays is not None
        return self.transport.send(self._host_arrays(chunk))

    def fetch(self, chunk: ChunkT) -> MaybeTensors:
        """``chunk``'s arrays on the device; starts moving the next chunk's.

        Args:
            chunk: A scheduled chunk (one fetched again, as in a second pass, is
                copied again).

        Returns:
            Its arrays as device tensors, in the order ``host_arrays`` lists them.
        """
        assert self.transport is not None, "schedule() the chunks first"
        pending = self._pending.pop(id(chunk), None)
        if pending is None:
            pending = self._send(chunk)
        tensors = self.transport.wait(pending)
        following = self._following.get(id(chunk))
        if following is not None and id(following) not in self._pending:
            self._pending[id(following)] = self._send(following)
        return tensors


class RowSource(Protocol):
    """What a reward-net call gathers its inputs from (a ``FragmentLayout``)."""

    @property
    def n_transitions(self) -> int:
        """Transitions in the source."""

    def gather(
        self,
        start: int,
        stop: int,
        next_obs: bool = True,
    ) -> Tuple[HostArray, HostArray, Optional[HostArray], HostArray]:
        """``(obs, acts, next_obs, dones)`` of transitions ``[start, stop)``."""


@dataclasses.dataclass
class StagedRows:
    """Transitions ``[offset, offset + len)`` of a layout, already on the device.

    It gathers as the layout does, by slicing: a call on it moves nothing.
    """

    fields: Tuple[th.Tensor, th.Tensor, Optional[th.Tensor], th.Tensor]
    offset: int
    n_transitions: int
    """Transitions of the whole layout (as ``FragmentLayout.n_transitions``)."""

    def gather(
        self,
        start: int,
        stop: int,
        next_obs: bool = True,
    ) -> Tuple[th.Tensor, th.Tensor, Optional[th.Tensor], th.Tensor]:
        """``(obs, acts, next_obs, dones)`` of transitions ``[start, stop)``."""
        lo, hi = start - self.offset, stop - self.offset
        obs, acts, next_frames, dones = self.fields
        if next_obs and next_frames is None:
            raise ValueError("next observations were not staged")
        return (
            obs[lo:hi],
            acts[lo:hi],
            None if next_frames is None or not next_obs else next_frames[lo:hi],
            dones[lo:hi],
        )


#: A chunk's transition ranges: ``(source, start, stop)`` each.
Ranges = Sequence[Tuple[RowSource, int, int]]


class RangeStager(Generic[ChunkT]):
    """A :class:`Stager` for chunks made of transition ranges of layouts.

    Args:
        transport: As for :class:`Stager`.
    """

    def __init__(self, transport: Optional[Transport] = None) -> None:
        self.stager: Stager[ChunkT] = Stager(transport)
        self._ranges: Optional[Callable[[ChunkT], Ranges]] = None

    def schedule(
        self,
        chunks: Sequence[ChunkT],
        ranges: Callable[[ChunkT], Ranges],
        device: th.device,
        *,
        next_obs: bool,
    ) -> None:
        """Sets the chunks of a step and the ranges each one reads.

        Args:
            chunks: The step's chunks, in the order they will be fetched.
            ranges: A chunk's ranges.
            device: Where the inputs go.
            next_obs: Whether next observations are gathered and moved too.
        """
        self._ranges = ranges

        def host_arrays(chunk: ChunkT) -> MaybeArrays:
            arrays: List[Optional[HostArray]] = []
            for source, start, stop in ranges(chunk):
                arrays.extend(source.gather(start, stop, next_obs=next_obs))
            return arrays

        self.stager.schedule(chunks, host_arrays, device)

    def fetch(self, chunk: ChunkT) -> List[StagedRows]:
        """``chunk``'s ranges on the device, one :class:`StagedRows` each."""
        assert self._ranges is not None, "schedule() the chunks first"
        tensors = self.stager.fetch(chunk)
        rows = []
        for k, (source, start, _) in enumerate(self._ranges(chunk)):
            obs, acts, next_obs, dones = tensors[4 * k : 4 * k + 4]
            assert obs is not None and acts is not None and dones is not None
            fields = (obs, acts, next_obs, dones)
            rows.append(StagedRows(fields, start, source.n_transitions))
        return rows
