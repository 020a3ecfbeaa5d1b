"""A no-grad evaluation of chunks: full-batch loss and metrics, in evaluation mode."""

from typing import TYPE_CHECKING, Any, Dict, List, Sequence

import torch as th
from imitation.util import networks

from imitation_accum.engine.task import (
    AccumulationTask,
    EvaluationResult,
    concat_losses,
)
from imitation_accum.planning.plan import StepPlan

if TYPE_CHECKING:
    from imitation_accum.engine.accumulator import GradientAccumulator


def evaluate(
    engine: "GradientAccumulator",
    task: AccumulationTask[Any],
    chunks: Sequence[Any],
    *,
    plan: StepPlan,
    n_items: int,
) -> EvaluationResult:
    """See :meth:`GradientAccumulator.evaluate`; sums go through its hooks (DDP)."""
    item_losses: List[th.Tensor] = []
    metric_sums: Dict[str, th.Tensor] = {}
    with th.no_grad(), networks.evaluating(engine.net):
        for chunk in chunks:
            with engine.forward_context(grad=False):
                outputs = task.forward(chunk, plan.forward_size)
            out = task.loss(chunk, outputs.float())
            item_losses.append(out.item_losses)
            for name, value in out.metric_sums.items():
                metric_sums[name] = metric_sums.get(name, 0) + value
    losses = concat_losses(item_losses)
    total = engine._global_sum(th.as_tensor(losses.sum(), dtype=th.float64))
    return EvaluationResult(
        loss=float(total) / n_items,
        item_losses=losses,
        metrics=engine._global_means(metric_sums, task.metric_names, n_items),
    )
