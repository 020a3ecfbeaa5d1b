"""Timing reward-net calls: forward and backward, one pass against two.

The planner's measurements: :func:`time_forward_backward` times calls and the
backward of their sum without touching ``.grad``; :func:`time_passes` times a
chunk's one-pass work against the two-pass method's.
"""

import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch as th

from imitation_accum.engine import observability

#: Measurements of each timing that count, interleaved (their median counts).
REPEATS = 3


def time_passes(
    call: Callable[[int, int], th.Tensor],
    n_transitions: int,
    forward_size: int,
    params: List[th.Tensor],
    device: th.device,
    repeats: int = REPEATS,
    clear_ratio: Optional[float] = None,
    clock: Optional[Callable[[], float]] = None,
) -> Tuple[float, float]:
    """Seconds of one pass and of two passes over ``n_transitions``.

    One pass: every call of ``forward_size`` transitions with gradient, then one
    backward of them all. Two passes: every call without gradient, then every
    call again with gradient and its backward at once. ``.grad`` is not touched.

    Args:
        call: Runs one reward-net call on transitions ``[start, stop)``.
        n_transitions: Transitions to run.
        forward_size: Transitions per call.
        params: Parameters to differentiate with respect to.
        device: Where the work runs.
        repeats: Timings of each, interleaved (the median counts).
        clear_ratio: After the first timing of each, stop if two passes took at
            least this many times one pass's time (the answer is clear then).
        clock: Reads seconds (default ``time.perf_counter``; see
            :func:`~imitation_accum.planning.cpu_load.call_clock`).

    Returns:
        ``(one-pass seconds, two-pass seconds)``.
    """
    clock = clock or time.perf_counter
    bounds = [
        (start, min(start + forward_size, n_transitions))
        for start in range(0, n_transitions, forward_size)
    ]
    wanted = [p for p in params if p.requires_grad]

    def two_passes() -> None:
        with th.no_grad():
            for start, stop in bounds:
                call(start, stop)
        for start, stop in bounds:
            th.autograd.grad(call(start, stop).float().sum(), wanted, allow_unused=True)

    def one_pass() -> None:
        outputs = th.cat([call(start, stop) for start, stop in bounds])
        th.autograd.grad(outputs.float().sum(), wanted, allow_unused=True)

    seconds: Dict[Callable[[], None], List[float]] = {two_passes: [], one_pass: []}
    for index in range(repeats):  # interleaved, alternating which goes first
        runs = list(seconds) if index % 2 == 0 else list(seconds)[::-1]
        for run in runs:
            observability.synchronize(device)
            begin = clock()
            run()
            observability.synchronize(device)
            seconds[run].append(clock() - begin)
        if (
            index == 0
            and clear_ratio is not None
            and seconds[two_passes][0] >= clear_ratio * seconds[one_pass][0]
        ):
            break
    return statistics.median(seconds[one_pass]), statistics.median(seconds[two_passes])


def time_forward_backward(
    run: Callable[[], th.Tensor],
    params: List[th.Tensor],
    device: th.device,
    clock: Optional[Callable[[], float]] = None,
) -> float:
    """Seconds for ``run()`` and a backward of its sum, without touching ``.grad``.

    Args:
        run: Computes outputs that depend on ``params``.
        params: Parameters to differentiate with respect to.
        device: Where the work runs (synchronized around the timing).
        clock: Reads seconds (default ``time.perf_counter``; see
            :func:`~imitation_accum.planning.cpu_load.call_clock`).

    Returns:
        Elapsed seconds on ``clock``.
    """
    clock = clock or time.perf_counter
    observability.synchronize(device)
    start = clock()
    outputs = run()
    wanted = [p for p in params if p.requires_grad]
    th.autograd.grad(outputs.sum(), wanted, allow_unused=True)
    observability.synchronize(device)
    return clock() - start
