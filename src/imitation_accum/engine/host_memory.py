"""Freed host memory kept for the next chunk while a reward net trains on a CPU.

A CPU step allocates a chunk's activations (hundreds of MiB for a CNN on Atari
frames), frees them after the chunk's backward, and allocates them again for the
next chunk. glibc's ``malloc`` gives the freed top of its heap back to the
kernel once it exceeds its trim threshold, so the next chunk faults every page
in again: 30,000 to 60,000 page faults an epoch in the benchmark's CNN runs, 5
to 8 % of an epoch, in the memory-bound element-wise kernels (ReLU and its
backward). Whether a given loop meets it depends on the order of its
allocations, not on what it computes.

:func:`kept_for_reuse` raises the trim threshold to 2 GiB while training, so
that freed memory stays in the process for the next chunk, and lowers it to
64 MiB when training ends, so that the heap's top goes back to the kernel at the
next ``free`` as it would have. It also fixes the threshold above which
``malloc`` maps blocks of their own at 32 MiB, the value glibc's own dynamic
rule converges to, since setting either parameter switches that rule off for the
process. Only on Linux with glibc, and not where the process's environment sets
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TOP_PAD_``
(its owner tuned ``malloc`` already); elsewhere it does nothing.
"""

import contextlib
import ctypes
import ctypes.util
import os
import sys
from typing import Iterator, Optional

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks above this are mapped on their own (glibc's dynamic ceiling on 64-bit).
MMAP_THRESHOLD_BYTES = 32 * 2**20
#: While training: the heap's top is trimmed only beyond this (``mallopt`` takes
#: an ``int``).
TRAINING_TRIM_THRESHOLD_BYTES = 2**31 - 1
#: After training: twice the mmap threshold, the trim threshold glibc's dynamic
#: rule would have reached.
RESTING_TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
#: Environment variables with which a process tunes glibc's malloc itself.
TUNING_VARIABLES = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)

_libc: Optional[ctypes.CDLL] = None
_looked_up = False


def glibc() -> Optional[ctypes.CDLL]:
    """The process's glibc, or ``None`` (another C library, or not Linux)."""
    global _libc, _looked_up
    if not _looked_up:
        _looked_up = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
                libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
                _libc = libc
            except (OSError, AttributeError):
                _libc = None
    return _libc


def applies() -> bool:
    """Whether :func:`kept_for_reuse` changes anything in this process."""
    if any(name in os.environ for name in TUNING_VARIABLES):
        return False
    return glibc() is not None


@contextlib.contextmanager
def kept_for_reuse(enabled: bool = True) -> Iterator[bool]:
    """Keeps freed heap memory in the process inside the block.

    Args:
        enabled: ``False`` makes it a no-op (the trainers' opt-out).

    Yields:
        Whether ``malloc`` was tuned (see the module's docstring for when not).
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
