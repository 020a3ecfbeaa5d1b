"""How many transitions go into one reward-net call: measured, not assumed.

On a CPU convolutions over Atari frames run several times faster in calls of a few
frames than in one large call, while a GPU wants large calls until it is
saturated. :class:`ForwardSizeTuner` times sizes 1, 2, 4, ...;
:class:`ForwardSizes` keeps one result per net architecture, input and device for
the planner that owns it; :func:`time_passes` times one pass against two.
"""

import time
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch as th
from torch import nn

from imitation_accum.engine import observability

#: Transitions each forward-size measurement runs (fewer in smaller chunks): a
#: one-pass chunk's worth, so that the allocator and caches see what a step does.
TUNING_TRANSITIONS = 256
#: Measurements longer than this (seconds) are not repeated.
LONG_MEASUREMENT_SECONDS = 0.5


class ForwardSizeTuner:
    """Chooses transitions per reward-net call by timing real calls.

    Sizes 1, 2, 4, ... are tried in turn, each timed as the best of ``repeats``
    measurements of the time per transition; the search stops once a size is
    ``stop_ratio`` times slower than the best seen (past the optimum) or at
    ``max_size``. The smallest size within ``tolerance`` of the best wins: on a
    CPU, smaller calls keep each activation within the allocator's reused blocks
    and the caches. An MLP, whose calls are dominated by fixed overhead, ends at
    ``max_size``.

    Args:
        repeats: Measurements per size (the fastest counts).
        stop_ratio: Stop when a size is this much slower per transition than the
            best so far.
        tolerance: Sizes this close to the best count as equally fast.
    """

    def __init__(
        self,
        *,
        repeats: int = 3,
        stop_ratio: float = 1.15,
        tolerance: float = 1.05,
    ) -> None:
        self.repeats = repeats
        self.stop_ratio = stop_ratio
        self.tolerance = tolerance

    def tune(self, time_per_transition: Callable[[int], float], max_size: int) -> int:
        """Returns the size with the least time per transition.

        Args:
            time_per_transition: Runs forward+backward work in calls of the given
                number of transitions and returns the seconds per transition.
            max_size: Largest size to try.

        Returns:
            The chosen number of transitions per call.
        """
        times: Dict[int, float] = {}
        size = 1
        while True:
            size = min(size, max_size)
            try:
                per_transition = self._measure(time_per_transition, size)
            except th.OutOfMemoryError:
                if not times:
                    raise
                break  # larger calls do not fit: the best so far it is
            times[size] = per_transition
            if per_transition > self.stop_ratio * min(times.values()):
                break
            if size == max_size:
                break
            size *= 2
        best = min(times.values())
        return min(s for s, t in times.items() if t <= self.tolerance * best)

    def _measure(self, time_per_transition: Callable[[int], float], size: int) -> float:
        first = time_per_transition(size)
        if first * max(size, TUNING_TRANSITIONS) > LONG_MEASUREMENT_SECONDS:
            # A long measurement averages itself; repeating it costs seconds.
            return first
        return min(
            [first] + [time_per_transition(size) for _ in range(self.repeats - 1)]
        )


class ForwardSizes:
    """Tuned call sizes, one per workload key; owned by a planner.

    Each key (net architecture, input, device, precision) is tuned once, the
    first time it is asked for; later requests reuse the result.

    Args:
        tuner: The search to run on a miss.
    """

    def __init__(self, tuner: Optional[ForwardSizeTuner] = None) -> None:
        self.tuner = tuner or ForwardSizeTuner()
        # key -> (tuned size, whether the search stopped at its size limit)
        self.found: Dict[Hashable, Tuple[int, bool]] = {}

    def size(
        self,
        key: Hashable,
        max_size: int,
        time_per_transition: Callable[[int], float],
    ) -> int:
        """The call size for calls of at most ``max_size`` transitions.

        Args:
            key: Identifies what the timing depends on.
            max_size: Largest size worth trying (transitions in a chunk).
            time_per_transition: See :meth:`ForwardSizeTuner.tune`.

        Returns:
            The cached or freshly tuned size, at most ``max_size``.
        """
        if key not in self.found:
            size = self.tuner.tune(time_per_transition, max_size)
            self.found[key] = (size, size == max_size)
        return self.resolve(self.found[key], max_size)

    @staticmethod
    def resolve(found: Tuple[int, bool], max_size: int) -> int:
        """A tuned ``(size, at_limit)`` applied to calls of at most ``max_size``."""
        size, at_limit = found
        # A search that ended at its limit found larger calls ever faster (an MLP,
        # a GPU below saturation): then calls as large as the whole chunk are best.
        return max_size if at_limit else min(size, max_size)


def architecture_key(net: nn.Module, *extra: Hashable) -> Hashable:
    """A cache key for a net's timing: its class, parameter shapes and ``extra``."""
    shapes = tuple(tuple(p.shape) for p in net.parameters())
    return (type(net).__qualname__, shapes, *extra)


def time_passes(
    call: Callable[[int, int], th.Tensor],
    n_transitions: int,
    forward_size: int,
    params: List[th.Tensor],
    device: th.device,
    repeats: int = 2,
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
        repeats: Timings of each (the fastest counts).

    Returns:
        ``(one-pass seconds, two-pass seconds)``.
    """
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

    seconds = {two_passes: float("inf"), one_pass: float("inf")}
    for _ in range(repeats):  # interleaved, the fastest of each counts
        for run in seconds:
            observability.synchronize(device)
            begin = time.perf_counter()
            run()
            observability.synchronize(device)
            seconds[run] = min(seconds[run], time.perf_counter() - begin)
    return seconds[one_pass], seconds[two_passes]


def time_forward_backward(
    run: Callable[[], th.Tensor],
    params: List[th.Tensor],
    device: th.device,
) -> float:
    """Seconds for ``run()`` and a backward of its sum, without touching ``.grad``.

    Args:
        run: Computes outputs that depend on ``params``.
        params: Parameters to differentiate with respect to.
        device: Where the work runs (synchronized around the timing).

    Returns:
        Elapsed wall-clock seconds.
    """
    observability.synchronize(device)
    start = time.perf_counter()
    outputs = run()
    wanted = [p for p in params if p.requires_grad]
    th.autograd.grad(outputs.sum(), wanted, allow_unused=True)
    observability.synchronize(device)
    return time.perf_counter() - start
