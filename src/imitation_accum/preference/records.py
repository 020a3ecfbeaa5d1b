"""What a preference trainer logs: full-batch figures under imitation's keys."""

import re
from typing import Mapping, Optional

import numpy as np
from imitation.util import logger as imit_logger

from imitation_accum.engine.task import StepResult
from imitation_accum.planning.plan import StepPlan
from imitation_accum.planning.probe import ActivationProfile


def record_step(
    logger: imit_logger.HierarchicalLogger,
    result: StepResult,
    plan: StepPlan,
    *,
    gt_loss: Optional[float],
    profile: Optional[ActivationProfile],
    skipped_steps: int,
) -> None:
    """Records one step's figures (under the caller's key prefix).

    Args:
        logger: Where to record.
        result: The step's full-batch figures.
        plan: The plan the step ran.
        gt_loss: The batch's mean ground-truth loss, if the data has rewards.
        profile: The memory probe's profile, if a budget was given.
        skipped_steps: float16 steps skipped for overflow so far.
    """
    logger.record("loss", result.loss)
    logger.record("accuracy", result.metrics["accuracy"])
    if gt_loss is not None:
        logger.record("gt_reward_loss", gt_loss)
    logger.record("grad_norm", result.grad_norm)
    logger.record("pairs_per_second", result.n_items / result.seconds)
    logger.record("minibatches_per_step", result.n_minibatches)
    logger.record("peak_memory_mib", result.peak_memory_bytes / 2**20)
    logger.record("forward_size", plan.forward_size)
    logger.record("two_pass", float(result.two_pass))
    logger.record("chunk_transitions", plan.largest_chunk)
    if profile is not None and plan.largest_chunk:
        estimate = profile.chunk_bytes(plan.largest_chunk, plan.forward_size)
        logger.record("memory_estimate_mib", estimate / 2**20)
    if result.loss_scale is not None:
        logger.record("amp_loss_scale", result.loss_scale)
        logger.record("amp_skipped_steps", skipped_steps)


def mean_of(values: Optional[np.ndarray], batch: np.ndarray) -> Optional[float]:
    """The mean of per-pair ``values`` over ``batch``, or ``None`` without values."""
    if values is None:
        return None
    return float(values[batch].mean(dtype=np.float64))


def record_final_values(logger: imit_logger.HierarchicalLogger, epoch_num: int) -> None:
    """Records the last epoch's means again under ``reward/final/``.

    Same keys as imitation's ``BasicRewardTrainer._train``, which has no hook
    for this.

    Args:
        logger: The trainer's logger, inside its ``accumulate_means``.
        epoch_num: The last epoch.
    """
    outer_prefix = logger.get_accumulate_prefixes()
    base_path = f"{outer_prefix}reward/"
    pattern = re.compile(rf"mean/{re.escape(base_path)}epoch-{epoch_num}/(.+)")
    for key in list(logger.name_to_value.keys()):
        if match := pattern.fullmatch(key):
            value = logger.name_to_value[key]
            logger.record(f"{base_path}final/{match.group(1)}", value)


def postfix(result: StepResult) -> Mapping[str, str]:
    """The progress bar's figures of a step."""
    return {
        "loss": f"{result.loss:.4f}",
        "acc": f"{result.metrics['accuracy']:.3f}",
        "pairs/s": f"{result.n_items / result.seconds:.1f}",
        "peak": f"{result.peak_memory_bytes / 2**20:.0f}MiB",
    }
