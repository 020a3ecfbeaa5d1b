"""Memory planning: budgets, the saved-bytes probe, checkpointing, OOM back-off.

A ``memory_budget`` bounds what training the reward net holds on its device:
parameters, their gradients, the optimizer's state, and one step's activations
and temporaries. The preference data already in memory is not counted.

Chunks are sized from a *probe*: a forward/backward of the reward net on a few
transitions, during which ``torch.autograd.graph.saved_tensors_hooks`` counts the
bytes autograd keeps for the backward. Their growth per transition, plus the
temporaries of the reward-net call being computed, gives the bytes of a chunk of
any size (:meth:`ActivationProfile.chunk_bytes`); the largest chunk that fits is
:meth:`ActivationProfile.max_chunk_transitions`.

The estimate is deliberately conservative. On CUDA an overrun raises
``torch.cuda.OutOfMemoryError``, which the trainers catch, halving the chunk and
redoing the step; on a CPU an overrun meets the kernel's OOM killer, so the
estimate is the only guard there. glibc's allocator may keep freed activations
resident (its mmap threshold grows with the blocks it frees), so that a step's
resident set was measured at up to 2.8 times the bytes autograd saved (one pass
over many small calls): the CPU estimate triples every per-transition figure
(``experiments/bench_memory.py`` checks the estimate against measured peaks).
"""

import contextlib
import dataclasses
import math
import os
import re
from typing import (
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import torch as th
from imitation.rewards import reward_nets
from imitation.util import networks
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

#: What a ``memory_budget`` argument may hold once checked.
Budget = Union[int, str]

AUTO = "auto"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BUDGET_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)

#: Share of the free memory an ``"auto"`` budget takes, per device type: other
#: processes (and, on a CPU, the page cache they need) keep the rest.
AUTO_FRACTION = {"cuda": 0.85, "cpu": 0.7}

#: Multiplier on every per-transition figure: allocator overheads. On a CPU glibc
#: may keep freed blocks resident (measured: up to 2.8x the saved bytes, 2.3x the
#: unmultiplied estimate); CUDA's caching allocator rounds blocks up and fragments.
ALLOCATOR_FACTOR = {"cuda": 1.2, "cpu": 3.0}

#: Fixed workspace per step beyond the estimate (library workspaces, cuDNN
#: algorithms, oneDNN scratch pads).
RESERVE_BYTES = {"cuda": 256 * 2**20, "cpu": 128 * 2**20}

#: Optimizer state per parameter, in parameter-sized tensors, for optimizers that
#: have not stepped yet (an unknown optimizer is assumed to keep two).
_STATE_TENSORS = {
    "SGD": 1,  # momentum buffer (only with momentum; counted anyway)
    "Adam": 2,
    "AdamW": 2,
    "Adamax": 2,
    "NAdam": 2,
    "RAdam": 2,
    "Adagrad": 1,
    "Adadelta": 2,
    "RMSprop": 3,  # square average, momentum buffer, grad average (centered)
}


def parse_budget(value: object, name: str = "memory_budget") -> Optional[Budget]:
    """Checks a memory budget: bytes, a size string or ``"auto"``.

    Args:
        value: ``None``, a positive number of bytes, a string such as ``"6GiB"``,
            ``"500MB"`` or ``"1.5 GB"`` (units B, KB, MB, GB, TB in powers of 1000,
            KiB, MiB, GiB, TiB in powers of 1024; case-insensitive), or ``"auto"``.
        name: The argument's name, for error messages.

    Returns:
        ``None``, a number of bytes, or ``"auto"``.

    Raises:
        ValueError: if the value is of another type, does not parse, or is not
            positive.
    """
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be bytes, a size such as '6GiB', or 'auto'")
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return AUTO
        match = _BUDGET_PATTERN.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"{name}={value!r} does not parse: give bytes, a size such as "
                "'6GiB' or '500MB' (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), "
                "or 'auto'",
            )
        number = float(match.group(1)) * _UNITS[unit]
    elif isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
    else:
        raise ValueError(
            f"{name} must be bytes, a size such as '6GiB', or 'auto'; got "
            f"{type(value).__name__}",
        )
    if not math.isfinite(number) or number < 1:
        raise ValueError(f"{name} must be a positive size, got {value!r}")
    return int(number)


def format_bytes(n_bytes: float) -> str:
    """``n_bytes`` in the largest binary unit that keeps it at least 1."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.2f} {unit}"
    return f"{n_bytes:.0f} B"


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_available() -> Optional[int]:
    # A container's limit (cgroup v2) may be far below what the host offers.
    try:
        with open("/sys/fs/cgroup/memory.max") as limit_file:
            limit = limit_file.read().strip()
        with open("/sys/fs/cgroup/memory.current") as current_file:
            current = int(current_file.read().strip())
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    return max(0, int(limit) - current)


def available_bytes(device: th.device) -> int:
    """Memory that training on ``device`` could still take.

    Args:
        device: The reward net's device.

    Returns:
        On CUDA, the device's free memory plus what PyTorch's caching allocator
        holds unused; elsewhere the host's available memory (``MemAvailable`` of
        ``/proc/meminfo``, or a container's remaining limit if lower).

    Raises:
        ValueError: if the host's available memory cannot be read.
    """
    if device.type == "cuda":
        free, _ = th.cuda.mem_get_info(device)
        cached = th.cuda.memory_reserved(device) - th.cuda.memory_allocated(device)
        return int(free + cached)
    candidates = [x for x in (_meminfo_available(), _cgroup_available()) if x]
    if not candidates:
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES")
            page_size = os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            raise ValueError(
                "memory_budget='auto' cannot read this host's available memory; "
                "give the budget in bytes",
            ) from None
        candidates = [int(pages * page_size)]
    return min(candidates)


def tensor_bytes(tensors: Iterable[th.Tensor]) -> int:
    """Bytes held by ``tensors`` (counted once per storage)."""
    storages: Dict[Tuple[str, int], int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def training_state_bytes(optimizer: th.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state that training keeps on the device.

    Optimizer state that does not exist yet (before the first step) is estimated
    from the optimizer's class (two parameter-sized tensors for Adam/AdamW; two
    for an optimizer this function does not know).

    Args:
        optimizer: The optimizer of the reward net.

    Returns:
        Bytes.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    param_bytes = tensor_bytes(params)
    state_tensors = [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, th.Tensor) and value.numel() > 1
    ]
    per_param = _STATE_TENSORS.get(type(optimizer).__name__, 2)
    if any(g.get("amsgrad") for g in optimizer.param_groups):
        per_param += 1
    state_bytes = max(tensor_bytes(state_tensors), per_param * param_bytes)
    return 2 * param_bytes + state_bytes  # parameters, gradients, state


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
    """Counts the bytes autograd saves during ``run(n_transitions)``.

    The output is then backpropagated with ``torch.autograd.grad`` (``.grad`` is
    left alone), which frees the graph.

    Args:
        run: One reward-net call (with gradient) on ``n`` transitions.
        n_transitions: Transitions to run.
        params: The net's parameters: never counted as saved, and the targets of
            the backward.
        device: Where the net lives.

    Returns:
        The bytes saved.
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
    with th.enable_grad(), th.autograd.graph.saved_tensors_hooks(pack, _identity):
        outputs = run(n_transitions)
    wanted = [p for p in params if p.requires_grad]
    if outputs.requires_grad and wanted:
        th.autograd.grad(outputs.float().sum(), wanted, allow_unused=True)
    del outputs
    peak = None
    if cuda:
        th.cuda.synchronize(device)
        peak = int(th.cuda.max_memory_allocated(device) - before)
    return SavedBytes(
        n_transitions,
        sum(storages.values()),
        max(storages.values(), default=0),
        peak,
    )


def _identity(tensor: th.Tensor) -> th.Tensor:
    return tensor


def _fit(points: Sequence[Tuple[int, float]]) -> Tuple[float, float]:
    """Slope per transition and intercept per call through ``(n, bytes)`` points.

    Conservative: the slope is at least the bytes per transition of the largest
    point when only one point is given or the points disagree; neither is negative.
    """
    (n1, b1), (n2, b2) = points[0], points[-1]
    if n2 == n1:
        return max(b2 / n2, 0.0), 0.0
    slope = max((b2 - b1) / (n2 - n1), 0.0)
    return slope, max(b1 - slope * n1, 0.0)


@dataclasses.dataclass(frozen=True)
class ActivationProfile:
    """Bytes a training step needs, as a function of its chunk and call sizes.

    ``chunk_bytes(n, calls of F)`` is ``fixed + reserve + factor * (n * saved +
    ceil(n / F) * saved_per_call + F * transient)`` per transition figures, and on
    CUDA at least the measured peak of the probe, extrapolated.
    """

    device_type: str
    fixed: int
    """Parameters, gradients and optimizer state."""
    saved_per_transition: float
    """Bytes autograd keeps per transition until the chunk's backward."""
    saved_per_call: float
    """Bytes autograd keeps per reward-net call (e.g. low-precision weight copies)."""
    transient_per_transition: float
    """Bytes per transition of the call being computed, beyond what it keeps:
    recomputed activations under checkpointing, gradients flowing back (twice the
    largest activation), converted inputs."""
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

    def chunk_bytes(self, n_transitions: int, call_size: int) -> float:
        """Bytes of a step with chunks of ``n_transitions`` in calls of ``call_size``.

        Args:
            n_transitions: Transitions of the largest chunk.
            call_size: Transitions per reward-net call.

        Returns:
            The estimate, in bytes.
        """
        call_size = max(1, min(call_size, n_transitions))
        calls = -(-n_transitions // call_size)
        variable = (
            n_transitions * self.saved_per_transition
            + calls * self.saved_per_call
            + call_size * self.transient_per_transition
        )
        if self.measured_peak is not None:
            per_transition, per_call = self.measured_peak
            # The probe's measured peak holds one call's saved and transient bytes.
            measured = (
                n_transitions * self.saved_per_transition
                + calls * self.saved_per_call
                + call_size * max(0.0, per_transition - self.saved_per_transition)
                + max(0.0, per_call - self.saved_per_call)
            )
            variable = max(variable, measured)
        return self.fixed + self.reserve + self.factor * variable

    def max_chunk_transitions(self, budget: int, limit: int) -> int:
        """The most transitions a chunk may hold in ``budget`` (calls as large).

        Args:
            budget: Bytes.
            limit: No answer above this.

        Returns:
            Transitions, or 0 if not even one fits.
        """
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

    def describe(self) -> str:
        """One line for the log."""
        return (
            f"saved {format_bytes(self.saved_per_transition)}/transition + "
            f"{format_bytes(self.saved_per_call)}/call, transient "
            f"{format_bytes(self.transient_per_transition)}/transition of a call, "
            f"fixed {format_bytes(self.fixed)} (parameters, gradients, optimizer "
            f"state), x{self.factor:g} allocator factor, "
            f"{format_bytes(self.reserve)} reserve"
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

    Args:
        run: One reward-net call with gradient, as the step makes it (same
            autocast and checkpointing), on the first ``n`` transitions of a sample.
        max_transitions: Transitions the sample holds.
        params: The net's parameters.
        device: The net's device.
        fixed_bytes: Parameters, gradients and optimizer state
            (:func:`training_state_bytes`).
        input_bytes_per_transition: Bytes of one transition's converted inputs.
        run_without_checkpointing: The same call without activation
            checkpointing, if ``run`` checkpoints: what a recomputation holds.

    Returns:
        The profile.
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
        device.type,
        fixed_bytes,
        saved_slope,
        saved_call,
        transient,
        peak,
    )


def resolve_budget(
    budget: Budget,
    device: th.device,
    resident_bytes: int,
) -> int:
    """The budget in bytes; ``"auto"`` takes a share of the free memory.

    Args:
        budget: Bytes or ``"auto"``.
        device: The reward net's device.
        resident_bytes: Training state already allocated on the device (it is
            part of what the budget covers, but no longer free).

    Returns:
        Bytes.
    """
    if budget != AUTO:
        return int(budget)
    fraction = AUTO_FRACTION.get(device.type, AUTO_FRACTION["cuda"])
    return int(fraction * available_bytes(device)) + resident_bytes


def resident_training_bytes(optimizer: th.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state already allocated."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    tensors: List[th.Tensor] = list(params)
    tensors += [p.grad for p in params if p.grad is not None]
    tensors += [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, th.Tensor)
    ]
    return tensor_bytes(tensors)


# Activation checkpointing ---------------------------------------------------


def checkpointable_cnns(net: nn.Module) -> List[nn.Module]:
    """The convolution stacks of imitation's CNN reward nets inside ``net``.

    Args:
        net: A reward net, possibly wrapped (normalized, shaped, ensembles).

    Returns:
        The ``cnn`` of every ``CnnRewardNet`` and the potential net of every
        ``BasicPotentialCNN`` in ``net``.
    """
    stacks: List[nn.Module] = []
    for module in net.modules():
        if isinstance(module, reward_nets.CnnRewardNet):
            stacks.append(module.cnn)
        elif isinstance(module, reward_nets.BasicPotentialCNN):
            stacks.append(module._potential_net)
    return stacks


def check_checkpointable(
    net: nn.Module,
    name: str = "activation_checkpointing",
) -> None:
    """Checks that ``net`` has a CNN stack to checkpoint, free of norm layers.

    Args:
        net: The reward net.
        name: The argument's name, for error messages.

    Raises:
        ValueError: if ``net`` holds no ``CnnRewardNet``/``BasicPotentialCNN``, or a
            stack holds a stateful norm layer (recomputation would update it twice).
    """
    stacks = checkpointable_cnns(net)
    if not stacks:
        raise ValueError(
            f"{name}=True needs a CnnRewardNet (or BasicPotentialCNN) in the reward "
            f"net; {type(net).__name__} has none",
        )
    for stack in stacks:
        for module in stack.modules():
            if isinstance(module, networks.BaseNorm):
                raise ValueError(
                    f"{name}=True: the CNN holds a {type(module).__name__}, whose "
                    "statistics a recomputation would update twice",
                )


@contextlib.contextmanager
def checkpointing(stacks: Sequence[nn.Module]) -> Iterator[None]:
    """Runs each stack under non-reentrant activation checkpointing.

    Within the context, a stack called with gradient enabled keeps only its input
    for the backward and recomputes its activations there (same dropout masks:
    the RNG state is replayed). The modules themselves are not changed: their
    ``forward`` is overridden on the instance and restored on exit, so state
    dicts and pickles are unaffected.

    Args:
        stacks: Modules to checkpoint (:func:`checkpointable_cnns`).

    Yields:
        None.
    """
    stacks = list({id(stack): stack for stack in stacks}.values())
    for stack in stacks:
        original = stack.forward

        def forward(
            x: th.Tensor,
            _original: Callable[[th.Tensor], th.Tensor] = original,
        ) -> th.Tensor:
            if not th.is_grad_enabled():
                return _original(x)
            return torch_checkpoint.checkpoint(_original, x, use_reentrant=False)

        stack.forward = forward
    try:
        yield
    finally:
        for stack in stacks:
            del stack.forward


# Out-of-memory back-off -----------------------------------------------------


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is PyTorch's out-of-memory error (of any accelerator)."""
    return isinstance(error, th.OutOfMemoryError)


def release_cached_memory(device: th.device) -> None:
    """Returns the caching allocator's unused blocks, after an out-of-memory error."""
    if device.type == "cuda":
        th.cuda.empty_cache()


def halved_chunk(
    transitions: int,
    error: BaseException,
    unit: str = "transition",
) -> int:
    """The chunk size to retry with after an out-of-memory error.

    Args:
        transitions: Transitions (or other units) of the largest chunk of the
            failed step.
        error: The out-of-memory error.
        unit: What ``transitions`` counts, for the message.

    Returns:
        Half of ``transitions`` (at least one).

    Raises:
        torch.OutOfMemoryError: if the failed chunk held a single unit.
    """
    if transitions <= 1:
        raise th.OutOfMemoryError(
            f"out of memory with chunks of one {unit}: the reward net does not "
            f"fit on its device for a single {unit} (plus parameters, "
            "gradients and optimizer state). Use a smaller net, "
            "activation_checkpointing=True, autocast_dtype, or a larger device. "
            f"The error was: {error}",
        ) from error
    return transitions // 2
