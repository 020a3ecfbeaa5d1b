"""What the planner may run to measure, and the timing of its calls.

A :class:`Workload` gives reward-net calls on the batch's data (each trainer
has its own: fragment pairs, discriminator rows); :func:`time_per_transition`
times calls of one size as a one-pass chunk runs them, for the forward-size
search, and :func:`measurement_transitions` sizes one such timing.
"""

import time
from typing import (
    Callable,
    ContextManager,
    Hashable,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

import torch as th

from imitation_accum.planning import cpu_load
from imitation_accum.planning.call_timing import time_forward_backward
from imitation_accum.planning.forward_size import TUNING_TRANSITIONS
from imitation_accum.planning.tuning_search import ClockedTiming

#: Forward-size timings that fit in one epoch's work, and the most transitions
#: one of them runs (see :func:`measurement_transitions`).
MEASUREMENTS_PER_EPOCH = 32
MAX_MEASUREMENT_TRANSITIONS = 256
#: Calls one timing runs at most (at least two).
MAX_CALLS_PER_TIMING = 4
#: A timing stops after the call that brings its forward calls past this many
#: seconds, even at one call: calls that long time steadily one by one, and a
#: heavy net's timings (Atari frames on a busy CPU) would take seconds each.
TIMING_FORWARD_SECONDS = 0.05

#: ``call(start, stop)``: one reward-net call on transitions ``[start, stop)``.
NetCall = Callable[[int, int], th.Tensor]


class Workload(Protocol):
    """What the planner may run to measure: reward-net calls on the batch's data."""

    key: Hashable
    """What timings depend on (net architecture, input, device, precision)."""

    @property
    def device(self) -> th.device:
        """Where the calls run."""

    @property
    def params(self) -> Sequence[th.Tensor]:
        """The parameters the calls differentiate with respect to."""

    def sample(self, n_transitions: int) -> Tuple[NetCall, int]:
        """Calls over the first items holding at least ``n_transitions``.

        Returns:
            The call and the number of transitions it may run (fewer than asked
            when the batch holds fewer).
        """

    def measuring(self, *, checkpointing: bool = True) -> ContextManager[None]:
        """Context of measuring calls: no trace on the RNG or norm statistics."""

    # Optional: ``epoch_transitions``, the transitions of one epoch, bounds the
    # tuning's cost (read with getattr; without it tuning is not bounded).


def time_per_transition(
    workload: Workload,
    size: int,
    *,
    limit: int,
    transitions: int = TUNING_TRANSITIONS,
    ceiling: Optional[float] = None,
    busy: bool = False,
) -> Union[float, ClockedTiming]:
    """Seconds per transition of ``workload``'s calls of ``size``, run as in a chunk.

    Calls of ``size`` over ``transitions`` transitions (two calls at least,
    :data:`MAX_CALLS_PER_TIMING` at most; fewer once the calls took
    :data:`TIMING_FORWARD_SECONDS`), their graphs kept, then one backward.
    With a ``ceiling`` (seconds per transition), the calls stop once they
    are slower than it, and the time per transition of those run so far is
    returned. On a ``busy`` CPU with
    one intra-op thread, seconds of this thread's CPU time
    (:func:`~imitation_accum.planning.cpu_load.call_clock`; the ceiling too),
    returned with the wall-clock seconds of the same calls.
    """
    clock = cpu_load.call_clock(busy)
    # Small calls cost most per transition: a timing of them need not be
    # as long to be as steady.
    calls = min(transitions, MAX_CALLS_PER_TIMING * size)
    total = min(limit, max(2 * size, calls))
    call, available = workload.sample(total)
    total = min(total, available)
    done = 0

    def run() -> th.Tensor:
        nonlocal done
        outputs, begin = [], clock()
        for start in range(0, total, size):
            done = min(start + size, total)
            outputs.append(call(start, done))
            elapsed = clock() - begin
            if elapsed > TIMING_FORWARD_SECONDS or (
                ceiling is not None and elapsed > ceiling * done
            ):
                break
        return th.cat(outputs)

    with workload.measuring():
        wall_begin = time.perf_counter()
        seconds = time_forward_backward(
            run,
            list(workload.params),
            workload.device,
            clock=clock,
        )
        wall = time.perf_counter() - wall_begin
    if clock is time.perf_counter:
        return seconds / done
    return ClockedTiming(seconds / done, wall / done)


def measurement_transitions(epoch_transitions: Optional[int]) -> int:
    """Transitions one forward-size timing runs: a share of an epoch, bounded.

    :data:`MEASUREMENTS_PER_EPOCH` timings fit in an epoch's work; at least
    :data:`TUNING_TRANSITIONS` (a few calls), at most
    :data:`MAX_MEASUREMENT_TRANSITIONS` (enough for steady timings).
    """
    if epoch_transitions is None:
        return TUNING_TRANSITIONS
    share = epoch_transitions // MEASUREMENTS_PER_EPOCH
    return int(min(MAX_MEASUREMENT_TRANSITIONS, max(TUNING_TRANSITIONS, share)))
