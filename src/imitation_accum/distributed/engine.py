"""Reward-model steps shared by a process group (DDP): N ranks give one's update.

How shares are combined: docs/offline-and-distributed.md.
"""

import contextlib
import dataclasses
import functools
import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar

import torch as th
import torch.distributed as dist
from torch import nn

from imitation_accum.engine import norm_replay
from imitation_accum.engine.accumulator import (
    AccumulationTask,
    GradientAccumulator,
    StepResult,
    Update,
    forked_rng,
)
from imitation_accum.planning.plan import StepPlan

ChunkT = TypeVar("ChunkT")


class DistributedGradientAccumulator(GradientAccumulator[ChunkT]):
    """A :class:`GradientAccumulator` whose steps are shared by a process group.

    Each rank passes its own chunks and the item count of the *whole* batch to
    :meth:`step`. Losses are divided by the whole batch's items and multiplied by
    the ranks (undoing DDP's average); every minibatch but a rank's last runs
    under ``no_sync()``; norm moments are merged in rank order and DDP's buffer
    broadcast is off; a rank without items runs the net on zero items.

    Args:
        net: The reward net; every call of it by a task must go through :attr:`ddp`.
        empty_forward: Returns the output of the module it is given (:attr:`ddp`)
            on zero items.
        process_group: The group to share steps with (default: the default one).

    Raises:
        RuntimeError: if ``torch.distributed`` is not initialized.
    """

    def __init__(
        self,
        net: nn.Module,
        *,
        empty_forward: Callable[[nn.Module], th.Tensor],
        process_group: Optional[dist.ProcessGroup] = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "DistributedGradientAccumulator needs an initialized process group "
                "(see imitation_accum.distributed.init_distributed)",
            )
        super().__init__(net)
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        nccl = dist.get_backend(process_group) == "nccl"
        self._comm_device = self.device if nccl else th.device("cpu")
        self.ddp = nn.parallel.DistributedDataParallel(
            net,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            process_group=process_group,
            **self._ddp_options(),
        )
        self.forward_module = self.ddp
        self._empty_forward = empty_forward

    def _ddp_options(self) -> Dict[str, Any]:
        # No buffer broadcast before each forward: every rank computes the whole
        # batch's norm statistics itself. torch 2.13 splits broadcast_buffers (at
        # init and in forward) into forward_sync_buffers (in forward only).
        parameters = inspect.signature(nn.parallel.DistributedDataParallel).parameters
        if "forward_sync_buffers" in parameters:
            return {"forward_sync_buffers": False}
        return {"broadcast_buffers": False}

    def step(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        *,
        plan: StepPlan,
        n_items: int,
        update: Update,
    ) -> StepResult:
        """Runs this rank's share of one optimizer step.

        Args:
            task: As in :meth:`GradientAccumulator.step`.
            chunks: This rank's share of the batch, split (may be empty).
            plan: This rank's plan; its ``net_calls`` are summed over ranks.
            n_items: Items in the whole batch, over all ranks.
            update: As in :meth:`GradientAccumulator.step`.

        Returns:
            The step's full-batch figures (``item_losses``: this rank's only).

        Raises:
            RuntimeError: on running out of memory (not redone under DDP).
        """
        calls = int(self._global_sum(th.tensor(float(plan.net_calls))))
        if self.norms.active:
            # Always replay the norm update from every rank's moments, even when
            # one call would update the layers itself: every rank must end with
            # the same buffers, including ranks that see nothing.
            calls = max(calls, 2)
        try:
            return super().step(
                task,
                chunks,
                plan=dataclasses.replace(plan, net_calls=calls),
                n_items=n_items,
                update=update,
            )
        except th.OutOfMemoryError as error:
            # A single-process trainer redoes the step with smaller chunks; one
            # rank redoing alone would desynchronize the ranks' collectives.
            raise RuntimeError(
                f"out of memory on rank {self.rank} with {len(chunks)} minibatches "
                "of this rank's share: give a smaller memory_budget or "
                "minibatch_size (steps are not redone under DDP)",
            ) from error

    def _chunk_context(
        self, index: int, n_chunks: int
    ) -> contextlib.AbstractContextManager:
        return self.ddp.no_sync() if index < n_chunks - 1 else contextlib.nullcontext()

    def _backward(self, loss: th.Tensor) -> None:
        # DDP divides the summed gradient by the number of ranks; the losses are
        # already divided by the whole batch's size.
        super()._backward(loss * self.world_size)

    def _global_sum(self, value: th.Tensor) -> th.Tensor:
        total = value.detach().to(self._comm_device, th.float64, copy=True)
        dist.all_reduce(total, group=self.process_group)
        return total

    def _join_without_items(self) -> None:
        with forked_rng(self.device), self.norms.frozen():
            output = self._empty_forward(self.ddp)
            self._backward(output.sum())

    def _all_reduce_moments(
        self,
        moments: norm_replay.CallMoments,
    ) -> norm_replay.CallMoments:
        layers = self.norms.layers
        calls = th.tensor([float(len(c)) for c in moments], device=self._comm_device)
        dist.all_reduce(calls, op=dist.ReduceOp.MAX, group=self.process_group)
        # One row per call of each layer, [count, mean..., m2...]; zeros for a call
        # this rank did not make.
        slots = [
            (i, call) for i, n in enumerate(calls.tolist()) for call in range(int(n))
        ]
        widths = [1 + 2 * layers[i].running_mean.numel() for i, _ in slots]
        local = th.zeros(sum(widths), dtype=th.float64, device=self._comm_device)
        for row, (i, call) in zip(local.split(widths), slots):
            if call < len(moments[i]):
                m = moments[i][call]
                row[0] = m.count
                row[1:] = th.cat([m.mean.reshape(-1), m.m2.reshape(-1)])
        gathered = [th.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local, group=self.process_group)
        merged: norm_replay.CallMoments = [[] for _ in layers]
        for (i, _), rows in zip(slots, zip(*(g.split(widths) for g in gathered))):
            shape = layers[i].running_mean.shape
            parts = [  # in rank order, the same on every rank
                norm_replay.Moments(
                    int(row[0]), *row[1:].to(self.device).reshape(2, *shape)
                )
                for row in rows
                if int(row[0])
            ]
            # Some rank made this call: parts is not empty.
            merged[i].append(functools.reduce(norm_replay.Moments.merge, parts))
        return merged

    def broadcast(self, values: Sequence[float], src: int = 0) -> Tuple[float, ...]:
        """Rank ``src``'s ``values`` (numbers, as many on every rank) on every rank."""
        tensor = th.tensor(list(values), dtype=th.float64, device=self._comm_device)
        dist.broadcast(tensor, src, group=self.process_group)
        return tuple(tensor.tolist())
