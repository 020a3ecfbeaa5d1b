"""The preference reward trainer whose steps a process group shares."""

import inspect
from typing import Any, List, Optional, cast

import numpy as np
import torch as th
import torch.distributed as dist
from torch import nn

from imitation_accum import _validation
from imitation_accum.distributed.engine import DistributedGradientAccumulator
from imitation_accum.distributed.process_group import check_batch_size, local_share
from imitation_accum.engine.accumulator import GradientAccumulator
from imitation_accum.preference.trainer import CrossEntropyRewardTrainer


class DistributedRewardTrainer(CrossEntropyRewardTrainer):
    """A :class:`CrossEntropyRewardTrainer` that shares each step among processes.

    The trained net, its norm statistics and every logged figure equal one
    process's on the same data: ``batch_size`` pairs per step over all ranks, at
    most ``minibatch_size`` per forward/backward on each. Every rank builds the
    trainer alike (``rng`` seeded the same) on the same dataset; rank 0 alone shows
    a progress bar. Outside a group of several processes this is a plain
    :class:`CrossEntropyRewardTrainer`.

    Args:
        *args: The arguments of :class:`CrossEntropyRewardTrainer`, in its order;
            ``batch_size`` at least the number of processes.
        process_group: The group to share steps with (default: the default group).
        **kwargs: Keyword arguments of :class:`CrossEntropyRewardTrainer`.

    Raises:
        ValueError: if ``batch_size`` is smaller than the number of processes, or
            the ranks' generators are not seeded alike.

    Example:
        >>> # torchrun --nproc_per_node=2 train.py
        >>> with distributed_session() as context:  # doctest: +SKIP
        ...     trainer = DistributedRewardTrainer(
        ...         pc.PreferenceModel(reward_net.to(context.device)),
        ...         pc.CrossEntropyRewardLoss(),
        ...         rng=np.random.default_rng(0),
        ...         batch_size=64,
        ...         minibatch_size=8,
        ...     )
        ...     trainer.train(dataset)
    """

    def __init__(
        self,
        *args: Any,
        process_group: Optional[dist.ProcessGroup] = None,
        **kwargs: Any,
    ) -> None:
        self.process_group = process_group
        distributed = dist.is_initialized()
        self.world_size = dist.get_world_size(process_group) if distributed else 1
        self.rank = dist.get_rank(process_group) if distributed else 0
        bound = inspect.signature(CrossEntropyRewardTrainer).bind(*args, **kwargs)
        batch_size = bound.arguments.get("batch_size", 32)
        batch_size = _validation.positive_int("batch_size", batch_size)
        check_batch_size("batch_size", batch_size, self.world_size)
        if self.rank != 0:
            kwargs["progress_bar"] = False
        super().__init__(*args, **kwargs)
        if self.distributed:
            self._check_same_rng()

    @property
    def distributed(self) -> bool:
        """Whether steps are shared with other processes."""
        return self.world_size > 1

    def _make_engine(self) -> GradientAccumulator:
        if not self.distributed:
            return super()._make_engine()
        return DistributedGradientAccumulator(
            self._preference_model.model,
            empty_forward=self._empty_forward,
            process_group=self.process_group,
        )

    def _local_items(self, indices: np.ndarray) -> np.ndarray:
        return local_share(indices, self.rank, self.world_size)

    def _empty_forward(self, module: nn.Module) -> th.Tensor:
        # module (the net, through DDP) on zero transitions
        net = self._task.net
        obs_space, act_space = net.observation_space, net.action_space
        obs = np.zeros((0, *(obs_space.shape or ())), dtype=obs_space.dtype)
        acts = np.zeros((0, *(act_space.shape or ())), dtype=act_space.dtype)
        dones = np.zeros(0, dtype=bool)
        return module(*net.preprocess(obs, acts, obs, dones))

    def _check_same_rng(self) -> None:
        states: List[Any] = [None] * self.world_size
        state = repr(self.rng.bit_generator.state)
        dist.all_gather_object(states, state, group=self.process_group)
        differing = [r for r, other in enumerate(states) if other != states[0]]
        if differing:
            raise ValueError(
                "rng must be seeded identically on every process (each draws the "
                f"same batches and computes its share); ranks {differing} differ "
                "from rank 0",
            )

    def _agreed_forward_size(self, size: Optional[int]) -> Optional[int]:
        # Each rank derives the same size; rank 0's is broadcast anyway, so that
        # one logged forward_size holds for the group.
        if not self.distributed:
            return size
        engine = cast(DistributedGradientAccumulator, self.engine)
        (agreed,) = engine.broadcast([float(size or 0)])
        return int(agreed) or None
