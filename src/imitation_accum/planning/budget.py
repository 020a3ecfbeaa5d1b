"""Memory budgets: parsing, ``"auto"``, and what training state needs.

A ``memory_budget`` bounds what training holds on the device: parameters, gradients,
optimizer state and one step's activations (not the data already in memory).
"""

import math
import os
import re
from typing import Dict, Iterable, Optional, Tuple, Union

import numpy as np
import torch as th

#: What a ``memory_budget`` argument may hold once checked.
Budget = Union[int, str]

AUTO = "auto"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update(kib=2**10, mib=2**20, gib=2**30, tib=2**40)
_BUDGET_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)

#: Share of the free memory an ``"auto"`` budget takes, per device type: other
#: processes (and, on a CPU, the page cache they need) keep the rest.
AUTO_FRACTION = {"cuda": 0.85, "cpu": 0.7}

#: Parameter-sized state tensors of optimizers that have not stepped yet (unknown:
#: two). SGD's momentum buffer counts even without momentum.
_STATE_TENSORS = {"SGD": 1, "Adagrad": 1, "RMSprop": 3}


def parse_budget(value: object, name: str = "memory_budget") -> Optional[Budget]:
    """A memory budget: ``None``, bytes, ``"auto"``, or a size string in bytes.

    Args:
        value: ``None``, a positive number of bytes, a string such as ``"6GiB"``,
            ``"500MB"`` or ``"1.5 GB"`` (units B, KB, MB, GB, TB in powers of 1000,
            KiB, MiB, GiB, TiB in powers of 1024; case-insensitive), or ``"auto"``.
        name: The argument's name, for error messages.

    Returns:
        ``None``, a number of bytes, or ``"auto"``.

    Raises:
        TypeError: if the value is neither a number nor a string.
        ValueError: if it does not parse or is not positive.
    """
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return AUTO
        match = _BUDGET_PATTERN.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"{name}={value!r} does not parse: give bytes, a size such as "
                "'6GiB' or '500MB' (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), "
                "or 'auto'"
            )
        number = float(match.group(1)) * _UNITS[unit]
    elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    ):
        number = float(value)
    else:
        raise TypeError(
            f"{name} must be bytes, a size such as '6GiB', or 'auto'; got "
            f"{type(value).__name__}"
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
    return None if limit == "max" else max(0, int(limit) - current)


def _sysconf_bytes(pages: str) -> Optional[int]:
    try:
        return int(os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes(device: th.device) -> int:
    """Memory training on ``device`` could still take (CUDA: free plus cached unused).

    Raises:
        ValueError: if the host's available memory cannot be read.
    """
    if device.type == "cuda":
        free, _ = th.cuda.mem_get_info(device)
        cached = th.cuda.memory_reserved(device) - th.cuda.memory_allocated(device)
        return int(free + cached)
    candidates = [x for x in (_meminfo_available(), _cgroup_available()) if x]
    if not candidates:
        candidates = [x for x in [_sysconf_bytes("SC_AVPHYS_PAGES")] if x is not None]
    if not candidates:
        raise ValueError(
            "memory_budget='auto' cannot read this host's available memory; "
            "give the budget in bytes"
        )
    return min(candidates)


def _tensor_bytes(tensors: Iterable[th.Tensor]) -> int:
    """Bytes held by ``tensors`` (counted once per storage)."""
    storages: Dict[Tuple[str, int], int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def _state_tensors(optimizer: th.optim.Optimizer) -> Iterable[th.Tensor]:
    for state in optimizer.state.values():
        yield from (v for v in state.values() if isinstance(v, th.Tensor))


def training_state_bytes(optimizer: th.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state that training keeps on the device.

    State not allocated yet is estimated from the optimizer's class.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    param_bytes = _tensor_bytes(params)
    per_param = _STATE_TENSORS.get(type(optimizer).__name__, 2)
    if any(g.get("amsgrad") for g in optimizer.param_groups):
        per_param += 1
    state = [t for t in _state_tensors(optimizer) if t.numel() > 1]
    return 2 * param_bytes + max(_tensor_bytes(state), per_param * param_bytes)


def resident_training_bytes(optimizer: th.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state already allocated."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    return _tensor_bytes([*params, *grads, *_state_tensors(optimizer)])


def resolve_budget(budget: Budget, device: th.device, resident_bytes: int) -> int:
    """The budget in bytes; ``"auto"`` takes a share of ``device``'s free memory.

    ``"auto"`` also covers ``resident_bytes``, training state already allocated.
    """
    if budget != AUTO:
        return int(budget)
    fraction = AUTO_FRACTION.get(device.type, AUTO_FRACTION["cuda"])
    return int(fraction * available_bytes(device)) + resident_bytes


def check_holds_training_state(
    memory_budget: Optional[Budget],
    optimizer: th.optim.Optimizer,
    what: str = "the parameters, their gradients and the optimizer state",
    name: str = "memory_budget",
) -> None:
    """Checks that a budget in bytes (argument ``name``) holds ``optimizer``'s ``what``.

    Raises:
        ValueError: if the budget is smaller.
    """
    if not isinstance(memory_budget, int):
        return
    needed = training_state_bytes(optimizer)
    if memory_budget < needed:
        raise ValueError(
            f"{name}={format_bytes(memory_budget)} is smaller than the "
            f"{format_bytes(needed)} that {what} need: give a larger budget, or "
            "'auto'"
        )


def _device_total_bytes(device: th.device) -> int:
    if device.type == "cuda":
        return int(th.cuda.get_device_properties(device).total_memory)
    return _sysconf_bytes("SC_PHYS_PAGES") or 0


def check_fits_device(
    memory_budget: Optional[Budget], device: th.device, name: str = "memory_budget"
) -> None:
    """Refuses a budget in bytes (argument ``name``) larger than all of ``device``'s.

    Such a budget (often a typo, ``"600GiB"``) would fail only once training
    allocates.

    Raises:
        ValueError: naming the budget and the device's memory.
    """
    total = _device_total_bytes(device)
    if isinstance(memory_budget, int) and total and memory_budget > total:
        raise ValueError(
            f"{name}={format_bytes(memory_budget)} is more than the {device} device "
            f"has ({format_bytes(total)}): give a smaller budget, or 'auto'"
        )
