"""What a preference trainer logs: full-batch figures under imitation's keys."""

import re
from typing import Mapping, Optional, Tuple

import numpy as np
from imitation.util import logger as imit_logger

from imitation_accum.engine.accumulator import StepResult
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
    exclude: Optional[Tuple[str, ...]] = None,
) -> None:
    """Records one step's figures (under the caller's key prefix).

    Args:
        logger: Where to record.
        result: The step's full-batch figures.
        plan: The plan the step ran.
        gt_loss: The batch's mean ground-truth loss, if the data has rewards.
        profile: The memory probe's profile, if a budget was given.
        skipped_steps: float16 steps skipped for overflow so far.
        exclude: Output formats to leave the figures out of (``("stdout",
            "log")``: files and TensorBoard only).
    """

    def record(key: str, value: float) -> None:
        logger.record(key, value, exclude)

    record("loss", result.loss)
    record("accuracy", result.metrics["accuracy"])
    if gt_loss is not None:
        record("gt_reward_loss", gt_loss)
    record("grad_norm", result.grad_norm)
    record("pairs_per_second", result.n_items / result.seconds)
    record("minibatches_per_step", result.n_minibatches)
    record("peak_memory_mib", result.peak_memory_bytes / 2**20)
    record("forward_size", plan.forward_size)
    record("two_pass", float(result.two_pass))
    record("chunk_transitions", plan.largest_chunk)
    if profile is not None and plan.largest_chunk:
        estimate = profile.chunk_bytes(plan.largest_chunk, plan.forward_size)
        record("memory_estimate_mib", estimate / 2**20)
    if result.loss_scale is not None:
        record("amp_loss_scale", result.loss_scale)
        record("amp_skipped_steps", skipped_steps)


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


def epoch_line(
    epoch_num: int,
    epochs: int,
    loss_sum: float,
    accuracy_sum: float,
    n_items: int,
    seconds: float,
) -> str:
    """One compact line of an epoch's training figures (item-weighted means).

    Args:
        epoch_num: The epoch, counted from 0.
        epochs: Epochs in this call of ``train``.
        loss_sum: Sum over the epoch's steps of loss times pairs.
        accuracy_sum: Sum over the epoch's steps of accuracy times pairs.
        n_items: Pairs trained on in the epoch.
        seconds: The epoch's steps' time.

    Returns:
        Such as ``reward model epoch 3/200: loss 0.6931, accuracy 0.500, 812
        pairs/s``.
    """
    rate = n_items / seconds if seconds > 0 else float("inf")
    return (
        f"reward model epoch {epoch_num + 1}/{epochs}: loss "
        f"{loss_sum / n_items:.4f}, accuracy {accuracy_sum / n_items:.3f}, "
        f"{rate:.0f} pairs/s"
    )
