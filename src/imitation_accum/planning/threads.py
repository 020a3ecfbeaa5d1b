"""Intra-op threads of the trainers' reward-net calls on a CPU.

A team of OpenMP threads waits for every core it asks for: where another job holds
one, each parallel region of a call waits out a scheduler quantum. Small calls
gain little from a second thread on free cores and lose that wait in every region
on shared ones (an MLP epoch ran 70x slower next to another PyTorch job). So a
call whose work per thread is below :data:`CALL_BYTES_PER_THREAD` gets fewer
threads. The work of a call is what the memory probe counts (the bytes of its
activations); the count is a pure function of that and of the cores, with nothing
timed, so the same configuration on the same machine runs the same threads and
gives bit-identical results, quiet or busy.

A user's own choice wins: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the
environment, or ``torch.set_num_threads`` set to a count other than PyTorch's
default (:func:`explicit_choice`). The count holds only while a step runs
(:func:`intra_op`); the caller's comes back afterwards, also after an error.
"""

import contextlib
import dataclasses
import functools
import os
from pathlib import Path
from typing import Iterator, Optional

import torch as th

from imitation_accum.planning import probe

#: A call gets one intra-op thread per this many bytes of activations (as the memory
#: probe counts them, saved and transient), at least one and at most the cores.
#: Measured on 2 cores by ``experiments/thread_threshold.py``
#: (docs/results/thread_threshold.md), in CPU time: every call from 3.8 MiB per
#: thread on ran 1.35x to 2.1x faster on two threads than on one; an MLP's calls of
#: 0.1 to 3.6 MiB per thread 0.2x to 1.18x.
CALL_BYTES_PER_THREAD = 4 * 2**20

#: Environment variables through which PyTorch takes its intra-op thread count.
ENVIRONMENT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_SYSFS_CPUS = Path("/sys/devices/system/cpu")


def intra_op_threads(call_bytes: float, cores: int) -> int:
    """Intra-op threads for a call of ``call_bytes`` on ``cores`` cores.

    One thread per :data:`CALL_BYTES_PER_THREAD`, at least one, at most ``cores``.

    Raises:
        ValueError: if ``cores`` is below 1 or ``call_bytes`` negative.
    """
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    if not call_bytes >= 0:
        raise ValueError(f"call_bytes must be >= 0, got {call_bytes}")
    return max(1, min(cores, int(call_bytes // CALL_BYTES_PER_THREAD)))


@functools.cache
def torch_default_threads() -> int:
    """The intra-op threads PyTorch starts with when no variable sets them.

    PyTorch counts physical cores (cpuinfo): on Linux the distinct (package, core)
    pairs of sysfs's CPU topology; elsewhere, or without it, ``os.cpu_count()``.
    """
    cores = set()
    for cpu in _SYSFS_CPUS.glob("cpu[0-9]*"):
        try:
            package = (cpu / "topology" / "physical_package_id").read_text().strip()
            core = (cpu / "topology" / "core_id").read_text().strip()
        except OSError:
            continue
        cores.add((package, core))
    return len(cores) or os.cpu_count() or 1


def usable_cores() -> int:
    """Cores this process may run on (its affinity), at most PyTorch's default."""
    affinity = getattr(os, "sched_getaffinity", None)
    available = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return max(1, min(available, torch_default_threads()))


def explicit_choice() -> Optional[str]:
    """Why the intra-op thread count is the user's (for the log); ``None`` if not.

    The user chose if ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set, or if
    ``torch.get_num_threads()`` differs from :func:`torch_default_threads`
    (``torch.set_num_threads`` was called). A ``torch.set_num_threads`` to the
    default count itself cannot be told from no call: set the variable to pin it.
    """
    for name in ENVIRONMENT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return f"{name}={value} is set"
    current, default = th.get_num_threads(), torch_default_threads()
    if current != default:
        return (
            f"torch.get_num_threads() is {current}, not PyTorch's default {default} "
            "(torch.set_num_threads was called)"
        )
    return None


@dataclasses.dataclass(frozen=True)
class ThreadPolicy:
    """How many intra-op threads a step's calls get: plain data of the step policy."""

    bytes_per_transition: float
    """Activation bytes of one transition of a call (the memory probe's)."""
    bytes_per_call: float
    """Activation bytes of a call beyond its transitions' (the memory probe's)."""
    cores: int
    """The cores the calls may use (:func:`usable_cores` when built)."""

    def threads(self, call_transitions: int) -> int:
        """Threads for calls of at most ``call_transitions`` (0: one thread)."""
        if call_transitions <= 0:
            return 1
        work = call_transitions * self.bytes_per_transition + self.bytes_per_call
        return intra_op_threads(work, self.cores)

    @classmethod
    def of(cls, profile: probe.ActivationProfile) -> Optional["ThreadPolicy"]:
        """The policy for calls ``profile`` describes; ``None`` if none is chosen.

        ``None`` (the caller's threads stay) off a CPU or where the user chose the
        thread count (:func:`explicit_choice`).
        """
        if profile.device_type != "cpu" or explicit_choice() is not None:
            return None
        return cls(
            profile.saved_per_transition + profile.transient_per_transition,
            profile.saved_per_call,
            usable_cores(),
        )


@contextlib.contextmanager
def intra_op(threads: Optional[int]) -> Iterator[None]:
    """Runs the block with ``threads`` intra-op threads (``None``: as they are).

    The caller's ``torch.get_num_threads()`` comes back afterwards, also when the
    block raises.
    """
    before = th.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    th.set_num_threads(threads)
    try:
        yield
    finally:
        th.set_num_threads(before)
