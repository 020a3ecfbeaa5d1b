"""The saved-bytes probe: what a chunk of any size needs, from a few small calls.

``saved_tensors_hooks`` count the bytes autograd keeps in calls on a few transitions.
The estimate is conservative: on a CPU an overrun meets the kernel's OOM killer.
"""

import dataclasses
import functools
from typing import Any, Callable, ContextManager, Dict, Optional, Sequence, Tuple

import torch as th

from imitation_accum.planning import budget

#: Multiplier for allocator overheads: on a CPU glibc may keep freed blocks resident
#: (measured: up to 2.3x the estimate); CUDA's allocator rounds up and fragments.
ALLOCATOR_FACTOR = {"cuda": 1.2, "cpu": 3.0}

#: On a CPU, one call's activations stay within this: convolutions over Atari frames
#: ran several times faster in calls of a few frames, while an MLP wants the chunk.
CPU_CALL_BYTES = 64 * 2**20

#: Fixed workspace per step beyond the estimate (cuDNN, oneDNN scratch pads).
RESERVE_BYTES = {"cuda": 256 * 2**20, "cpu": 128 * 2**20}


@dataclasses.dataclass(frozen=True)
class SavedBytes:
    """What autograd saved for one probe call of ``n_transitions``."""

    n_transitions: int
    saved: int
    """Bytes of the distinct storages saved for backward (parameters excluded)."""
    largest: int
    """Bytes of the largest single storage saved."""
    cuda_peak: Optional[int] = None
    """Peak CUDA memory the call's forward and backward added (CUDA only)."""


def measure_saved_bytes(
    run: Callable[[int], th.Tensor],
    n_transitions: int,
    params: Sequence[th.Tensor],
    device: th.device,
) -> SavedBytes:
    """Counts the bytes autograd saves during ``run(n_transitions)``, not ``params``.

    The output is then backpropagated with ``torch.autograd.grad`` (``.grad`` stays).
    """
    exclude = {(str(p.device), p.untyped_storage().data_ptr()) for p in params}
    storages: Dict[Tuple[str, int], int] = {}

    def pack(tensor: th.Tensor) -> th.Tensor:
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key not in exclude and tensor.device.type == device.type:
            storages[key] = storage.nbytes()
        return tensor

    cuda = device.type == "cuda"
    if cuda:
        th.cuda.synchronize(device)
        before = th.cuda.memory_allocated(device)
        th.cuda.reset_peak_memory_stats(device)
    with th.enable_grad(), th.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outputs = run(n_transitions)
    wanted = [p for p in params if p.requires_grad]
    if outputs.requires_grad and wanted:
        th.autograd.grad(outputs.float().sum(), wanted, allow_unused=True)
    del outputs
    peak = None
    if cuda:
        th.cuda.synchronize(device)
        peak = int(th.cuda.max_memory_allocated(device) - before)
    saved = storages.values()
    return SavedBytes(n_transitions, sum(saved), max(saved, default=0), peak)


def _fit(points: Sequence[Tuple[int, float]]) -> Tuple[float, float]:
    """Slope per transition and intercept per call (one point: all slope), >= 0."""
    (n1, b1), (n2, b2) = points[0], points[-1]
    if n2 == n1:
        return max(b2 / n2, 0.0), 0.0
    slope = max((b2 - b1) / (n2 - n1), 0.0)
    return slope, max(b1 - slope * n1, 0.0)


@dataclasses.dataclass(frozen=True)
class ActivationProfile:
    """Bytes a training step needs, as a function of its chunk and call sizes."""

    device_type: str
    fixed: int
    """Parameters, gradients and optimizer state."""
    saved_per_transition: float
    """Bytes autograd keeps per transition until the chunk's backward."""
    saved_per_call: float
    """Bytes autograd keeps per reward-net call (e.g. low-precision weight copies)."""
    transient_per_transition: float
    """Bytes per transition of the call being computed, beyond what it keeps."""
    measured_peak: Optional[Tuple[float, float]] = None
    """CUDA: (per transition, per call) of the probe's measured peak."""

    @property
    def factor(self) -> float:
        """The allocator overhead multiplier of the device type."""
        return ALLOCATOR_FACTOR.get(self.device_type, ALLOCATOR_FACTOR["cuda"])

    @property
    def reserve(self) -> int:
        """Fixed workspace bytes of the device type."""
        return RESERVE_BYTES.get(self.device_type, RESERVE_BYTES["cuda"])

    def chunk_bytes(self, n_transitions: int, forward_size: int) -> float:
        """Bytes of a step: chunks of ``n_transitions``, calls of ``forward_size``.

        On CUDA at least the probe's measured peak, extrapolated.
        """
        forward_size = max(1, min(forward_size, n_transitions))
        calls = -(-n_transitions // forward_size)
        kept = n_transitions * self.saved_per_transition + calls * self.saved_per_call
        variable = kept + forward_size * self.transient_per_transition
        if self.measured_peak is not None:
            per_transition, per_call = self.measured_peak
            # The probe's measured peak holds one call's saved and transient bytes.
            measured = (
                kept
                + forward_size * max(0.0, per_transition - self.saved_per_transition)
                + max(0.0, per_call - self.saved_per_call)
            )
            variable = max(variable, measured)
        return self.fixed + self.reserve + self.factor * variable

    def max_chunk_transitions(self, budget: int, limit: int) -> int:
        """Most transitions (at most ``limit``; 0 if none) a chunk may hold in bytes."""
        if self.chunk_bytes(1, 1) > budget:
            return 0
        low, high = 1, max(1, limit)
        if self.chunk_bytes(high, high) <= budget:
            return high
        while high - low > 1:  # chunk_bytes(n, n) grows with n
            middle = (low + high) // 2
            if self.chunk_bytes(middle, middle) <= budget:
                low = middle
            else:
                high = middle
        return low

    def forward_size(self) -> Optional[int]:
        """Transitions per call on a CPU (within :data:`CPU_CALL_BYTES`); else None."""
        if self.device_type != "cpu":
            return None
        per_transition = self.saved_per_transition + self.transient_per_transition
        return max(1, int(CPU_CALL_BYTES // max(per_transition, 1.0)))

    def describe(self) -> str:
        """One line for the log."""
        fmt = budget.format_bytes
        return (
            f"saved {fmt(self.saved_per_transition)}/transition + "
            f"{fmt(self.saved_per_call)}/call, transient "
            f"{fmt(self.transient_per_transition)}/transition of a call, "
            f"fixed {fmt(self.fixed)} (parameters, gradients, optimizer "
            f"state), x{self.factor:g} allocator factor, "
            f"{fmt(self.reserve)} reserve"
        )


def profile_activations(
    run: Callable[[int], th.Tensor],
    *,
    max_transitions: int,
    params: Sequence[th.Tensor],
    device: th.device,
    fixed_bytes: int,
    input_bytes_per_transition: float,
    run_without_checkpointing: Optional[Callable[[int], th.Tensor]] = None,
) -> ActivationProfile:
    """The probe: a few small reward-net calls, counted.

    ``run(n)`` is one reward-net call with gradient, as a step makes it, on the
    first ``n`` of ``max_transitions``; ``run_without_checkpointing`` the same call
    without checkpointing, if ``run`` checkpoints. ``fixed_bytes``: the training state.
    """
    sizes = sorted({max(1, min(2, max_transitions)), max(1, min(4, max_transitions))})
    measured = [measure_saved_bytes(run, n, params, device) for n in sizes]
    saved_slope, saved_call = _fit([(m.n_transitions, m.saved) for m in measured])
    plain = measured
    if run_without_checkpointing is not None:
        plain = [
            measure_saved_bytes(run_without_checkpointing, n, params, device)
            for n in sizes
        ]
    full_slope, _ = _fit([(m.n_transitions, m.saved) for m in plain])
    largest = max(m.largest / m.n_transitions for m in plain)
    transient = (
        max(0.0, full_slope - saved_slope) + 2 * largest + input_bytes_per_transition
    )
    peak = None
    if all(m.cuda_peak is not None for m in measured):
        peak = _fit([(m.n_transitions, float(m.cuda_peak or 0)) for m in measured])
    return ActivationProfile(
        device.type, fixed_bytes, saved_slope, saved_call, transient, peak
    )


def profile_calls(
    call: Callable[[int, int], th.Tensor],
    available: int,
    *,
    measuring: Callable[[bool], ContextManager[Any]],
    params: Sequence[th.Tensor],
    device: th.device,
    fixed_bytes: int,
    input_bytes_per_transition: float,
    checkpointed: bool,
) -> ActivationProfile:
    """:func:`profile_activations` of ``call(0, n)``, run in ``measuring(ckpt)``.

    ``call(start, stop)`` is one reward-net call on a sample of ``available``
    transitions; ``checkpointed`` steps are also measured without checkpointing.
    """

    def run(n: int, checkpointing: bool = True) -> th.Tensor:
        with measuring(checkpointing):
            return call(0, n)

    return profile_activations(
        run,
        max_transitions=available,
        params=params,
        device=device,
        fixed_bytes=fixed_bytes,
        input_bytes_per_transition=input_bytes_per_transition,
        run_without_checkpointing=(
            functools.partial(run, checkpointing=False) if checkpointed else None
        ),
    )


def fit_budget(
    memory_budget: budget.Budget,
    profile: ActivationProfile,
    *,
    device: th.device,
    resident_bytes: int,
    largest_batch: int,
    item: int,
    items: str = "pairs",
    unit: str = "transition",
) -> Tuple[int, str]:
    """Transitions per chunk (at most ``largest_batch``) a budget holds, and a log line.

    ``item`` is the transitions of the largest item (a pair, a row), ``items``
    their name in the log line.

    Raises:
        ValueError: if not even one ``unit`` fits.
    """
    in_bytes = budget.resolve_budget(memory_budget, device, resident_bytes)
    cap = profile.max_chunk_transitions(in_bytes, largest_batch)
    if cap == 0:
        raise ValueError(
            f"memory_budget={memory_budget!r} ({budget.format_bytes(in_bytes)}) "
            f"is too small: one {unit} needs an estimated "
            f"{budget.format_bytes(profile.chunk_bytes(1, 1))} "
            f"({profile.describe()})"
        )
    fits = (
        f"{cap // item} {items}"
        if cap >= item
        else f"less than one of {item} transitions: two passes"
    )
    whole = budget.format_bytes(profile.chunk_bytes(largest_batch, largest_batch))
    return cap, (
        f"memory_budget: {budget.format_bytes(in_bytes)}; probe: "
        f"{profile.describe()}; chunks of at most {cap} transitions ({fits}); a "
        f"whole batch in one chunk would need {whole}"
    )
