"""The planner: how each step's batch is cut into chunks and reward-net calls.

:class:`Planner` decides; :class:`StepPlan` is its decision, which the engine
consumes. Budgets, the saved-bytes probe, forward-size tuning and the
out-of-memory back-off are its parts.
"""

from imitation_accum.planning.call_timing import time_forward_backward, time_passes
from imitation_accum.planning.forward_size import (
    TUNING_TRANSITIONS,
    ForwardSizes,
    ForwardSizeTuner,
    architecture_key,
)
from imitation_accum.planning.plan import (
    StepPlan,
    n_calls,
    pair_chunks,
    plan_chunks,
    transition_ranges,
)
from imitation_accum.planning.planner import Planner
from imitation_accum.planning.workload import Workload

__all__ = [
    "TUNING_TRANSITIONS",
    "ForwardSizeTuner",
    "ForwardSizes",
    "Planner",
    "StepPlan",
    "Workload",
    "architecture_key",
    "n_calls",
    "pair_chunks",
    "plan_chunks",
    "time_forward_backward",
    "time_passes",
    "transition_ranges",
]
