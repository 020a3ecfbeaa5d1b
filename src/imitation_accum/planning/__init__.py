"""Planning: how each step's batch is cut into chunks and reward-net calls."""

from imitation_accum.planning.plan import (
    StepPlan,
    StepPolicy,
    n_calls,
    pair_chunks,
    plan_chunks,
    plan_evaluation,
    plan_step,
    run_step,
    transition_ranges,
)

__all__ = [
    "StepPlan",
    "StepPolicy",
    "n_calls",
    "pair_chunks",
    "plan_chunks",
    "plan_evaluation",
    "plan_step",
    "run_step",
    "transition_ranges",
]
