"""Freed host memory kept for the next chunk while a reward net trains on a CPU.

Beyond glibc's trim threshold the freed top of the heap goes back to the kernel, and
each chunk faults its activations in again (5 to 8 % of an epoch in CNN benchmarks).
"""

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Iterator, Optional

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks above this are mapped on their own (glibc's dynamic ceiling on 64-bit);
#: fixed, since setting either parameter switches glibc's dynamic rule off.
MMAP_THRESHOLD_BYTES = 32 * 2**20
#: While training: the heap's top is trimmed only beyond this (an ``int``).
TRAINING_TRIM_THRESHOLD_BYTES = 2**31 - 1
#: After training: the trim threshold glibc's dynamic rule would have reached.
RESTING_TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
#: Environment variables with which a process tunes glibc's malloc itself.
TUNING_VARIABLES = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)


@functools.cache
def glibc() -> Optional[ctypes.CDLL]:
    """The process's glibc, or ``None`` (another C library, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return libc


def applies() -> bool:
    """Whether :func:`kept_for_reuse` acts: glibc, no :data:`TUNING_VARIABLES` set."""
    if any(name in os.environ for name in TUNING_VARIABLES):
        return False
    return glibc() is not None


@contextlib.contextmanager
def kept_for_reuse(enabled: bool = True) -> Iterator[bool]:
    """Keeps freed heap memory in the process inside the block (trim threshold 2 GiB).

    Args:
        enabled: ``False`` makes it a no-op (the trainers' opt-out).

    Yields:
        Whether ``malloc`` was tuned.
    """
    libc = glibc() if enabled and applies() else None
    if libc is None:
        yield False
        return
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, TRAINING_TRIM_THRESHOLD_BYTES)
    try:
        yield True
    finally:
        libc.mallopt(M_TRIM_THRESHOLD, RESTING_TRIM_THRESHOLD_BYTES)
