"""The planner: chunks of a batch, and transitions per reward-net call.

Chunks are runs of consecutive items of the batch (``minibatch_size`` items each,
the last one possibly shorter). The number of transitions per reward-net call,
``forward_size``, is measured rather than assumed: on a CPU convolutions over Atari
frames run several times faster in calls of a few frames than in one large call,
while a GPU wants large calls until it is saturated.
"""

import time
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch as th
from torch import nn

from imitation_accum import observability


def plan_chunks(n_items: int, minibatch_size: Optional[int]) -> List[slice]:
    """Cuts ``n_items`` consecutive items into chunks of ``minibatch_size``.

    Args:
        n_items: Items in the batch.
        minibatch_size: Items per chunk; ``None`` means one chunk.

    Returns:
        Slices covering ``range(n_items)`` in order.
    """
    size = n_items if minibatch_size is None else max(1, minibatch_size)
    return [slice(s, min(s + size, n_items)) for s in range(0, n_items, size)]


def n_calls(n_transitions: int, forward_size: int) -> int:
    """Reward-net calls needed for ``n_transitions`` in calls of ``forward_size``."""
    return -(-n_transitions // forward_size)


class ForwardSizeTuner:
    """Chooses transitions per reward-net call by timing real calls.

    Sizes 1, 2, 4, ... are tried in turn, each timed as the best of ``repeats``
    forward+backward calls; the search stops once the time per transition is
    ``stop_ratio`` times the best seen (past the optimum) or at ``max_size``.
    An MLP, whose calls are dominated by fixed overhead, ends at ``max_size``.

    Args:
        repeats: Timed calls per size (the fastest counts).
        stop_ratio: Stop when a size is this much slower per transition than the
            best so far.
    """

    def __init__(self, *, repeats: int = 3, stop_ratio: float = 1.15) -> None:
        self.repeats = repeats
        self.stop_ratio = stop_ratio

    def tune(self, time_call: Callable[[int], float], max_size: int) -> int:
        """Returns the size with the least time per transition.

        Args:
            time_call: Runs one forward+backward call of the given number of
                transitions and returns its wall-clock seconds.
            max_size: Largest size to try.

        Returns:
            The chosen number of transitions per call.
        """
        best_size, best_time = max_size, float("inf")
        size = 1
        while True:
            size = min(size, max_size)
            per_transition = min(time_call(size) for _ in range(self.repeats)) / size
            if per_transition < best_time:
                best_size, best_time = size, per_transition
            elif per_transition > self.stop_ratio * best_time:
                break
            if size == max_size:
                break
            size *= 2
        return best_size


# key -> (tuned size, whether the search stopped at its size limit)
_TUNED: Dict[Hashable, Tuple[int, bool]] = {}


def tuned_forward_size(
    key: Hashable,
    max_size: int,
    time_call: Callable[[int], float],
    tuner: Optional[ForwardSizeTuner] = None,
) -> int:
    """Tunes once per process for each ``key`` (net architecture, input, device).

    Args:
        key: Identifies what the timing depends on.
        max_size: Largest size worth trying (transitions in a chunk).
        time_call: See :meth:`ForwardSizeTuner.tune`.
        tuner: The tuner to use on a cache miss.

    Returns:
        The cached or freshly tuned size, at most ``max_size``.
    """
    if key not in _TUNED:
        size = (tuner or ForwardSizeTuner()).tune(time_call, max_size)
        _TUNED[key] = (size, size == max_size)
    size, at_limit = _TUNED[key]
    # A search that ended at its limit found larger calls ever faster (an MLP, a
    # GPU below saturation): then calls as large as the whole chunk are best.
    return max_size if at_limit else min(size, max_size)


def architecture_key(net: nn.Module, *extra: Hashable) -> Hashable:
    """A cache key for a net's timing: its class, parameter shapes and ``extra``."""
    shapes = tuple(tuple(p.shape) for p in net.parameters())
    return (type(net).__qualname__, shapes, *extra)


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
