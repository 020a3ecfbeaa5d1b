"""Offline reward-model training shared by a process group (DDP under torchrun)."""

from imitation_accum.distributed.engine import DistributedGradientAccumulator
from imitation_accum.distributed.process_group import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DistributedContext,
    RankFailedError,
    backend_for,
    check_batch_size,
    check_same_on_every_rank,
    distributed_session,
    init_distributed,
    launched_by_torchrun,
    local_share,
    reporting_failures,
    resolve_device,
    shutdown_distributed,
)
from imitation_accum.distributed.trainer import DistributedRewardTrainer

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
    "DistributedContext",
    "DistributedGradientAccumulator",
    "DistributedRewardTrainer",
    "RankFailedError",
    "backend_for",
    "check_batch_size",
    "check_same_on_every_rank",
    "distributed_session",
    "init_distributed",
    "launched_by_torchrun",
    "local_share",
    "reporting_failures",
    "resolve_device",
    "shutdown_distributed",
]
