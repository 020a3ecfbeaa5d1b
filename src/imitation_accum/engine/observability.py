"""Figures the trainers report per step: peak memory and throughput."""

import resource
import sys

import torch as th


def reset_peak_memory(device: th.device) -> None:
    """Starts a new peak-memory window on ``device`` (CUDA only; see below)."""
    if device.type == "cuda":
        th.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: th.device) -> int:
    """Peak memory of the current window.

    On CUDA this is ``torch.cuda.max_memory_allocated`` since the last
    :func:`reset_peak_memory`; elsewhere it is the process's peak resident set
    size, which cannot be reset and so covers the whole process lifetime.

    Args:
        device: The device the reward net lives on.

    Returns:
        Peak memory in bytes.
    """
    if device.type == "cuda":
        return int(th.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def synchronize(device: th.device) -> None:
    """Waits for queued work on ``device``, so that wall-clock timings are real."""
    if device.type == "cuda":
        th.cuda.synchronize(device)
