"""Whether the CPU is shared, and intra-op threads scoped to a block.

On a machine whose cores are busy with another job's threads, an OpenMP team
of several threads waits for cores it does not get: a small reward-net call
that takes 0.2 ms on one thread can take 30 ms on two. :func:`oversubscribed`
reads the kernel's count of runnable threads, and :func:`intra_op_threads`
sets torch's intra-op thread count for a block and restores it after, so
that the forward-size tuner can time calls both ways and keep the faster;
:func:`call_clock` is the clock those timings read.
"""

import contextlib
import os
import time
from typing import Callable, Iterator, List, Optional

import torch as th

LOADAVG = "/proc/loadavg"
#: Readings of the runnable count taken at most (the majority decides): one is a
#: snapshot. A competing job's threads are runnable nearly all the time; two
#: readings apart that agree decide, a third settles a disagreement.
LOAD_SAMPLES = 3
#: Seconds between readings where no work spaces them (each sleep adds to the
#: first train()).
LOAD_SAMPLE_INTERVAL_SECONDS = 0.0005


def read_runnable() -> Optional[int]:
    """Threads runnable on the machine now, this one included (one reading).

    The fourth field of ``/proc/loadavg`` counts running and ready threads;
    ``None`` where the file does not exist (not Linux).
    """
    try:
        with open(LOADAVG) as loadavg:
            return int(loadavg.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def oversubscribed(
    threads: Optional[int] = None,
    between: Optional[Callable[[], object]] = None,
) -> bool:
    """Whether ``threads`` more intra-op threads would find the cores taken.

    Two readings of the runnable count decide where they agree; a third settles
    a disagreement (the majority counts).

    Args:
        threads: The threads this process would run (default: torch's
            intra-op count).
        between: Work run between the first two readings, which it spaces
            instead of a sleep (the tuner's first calls, for instance).

    Returns:
        True when the other runnable threads plus ``threads`` exceed the cores.
    """
    threads = th.get_num_threads() if threads is None else threads
    cores = cpu_count()
    verdicts: List[bool] = []
    for index in range(LOAD_SAMPLES):
        if index == 1 and between is not None:
            between()
        elif index:
            time.sleep(LOAD_SAMPLE_INTERVAL_SECONDS)
        runnable = read_runnable()
        if runnable is None:
            if between is not None and index == 0:
                between()
            return False
        others = max(0, runnable - 1)  # the thread reading the count is ours
        verdicts.append(others + threads > cores)
        if len(verdicts) == 2 and verdicts[0] == verdicts[1]:
            break
    return sum(verdicts) * 2 > len(verdicts)


def call_clock(busy: bool) -> Callable[[], float]:
    """The clock to time reward-net calls with: CPU time where preemption is noise.

    On an oversubscribed CPU (``busy``) with one intra-op thread, the calls and
    their backward run on this thread alone, so its CPU time is what they cost,
    without the slices the other jobs' threads hold the core: short timings on
    the wall clock vary severalfold with where those slices fall. Otherwise the
    wall clock: a team of several threads also waits for cores, which only the
    wall clock sees.

    Args:
        busy: Whether the CPU was found oversubscribed.

    Returns:
        ``time.thread_time`` or ``time.perf_counter``.
    """
    if busy and th.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


@contextlib.contextmanager
def intra_op_threads(threads: Optional[int]) -> Iterator[None]:
    """Runs the block with ``threads`` intra-op threads (``None``: unchanged)."""
    previous = th.get_num_threads()
    if threads is None or threads == previous:
        yield
        return
    th.set_num_threads(threads)
    try:
        yield
    finally:
        th.set_num_threads(previous)
