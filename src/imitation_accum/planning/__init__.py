"""Planning: how each step's batch is cut into chunks and reward-net calls.

:class:`StepPolicy` is a trainer's policy, plain data; :func:`plan_step` turns it
and a batch's lengths into the :class:`StepPlan` the engine runs. Memory budgets
and the saved-bytes probe give the policy its memory cap and default call size.
"""

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
