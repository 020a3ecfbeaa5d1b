"""The engine's hooks for scale-out and mixed precision.

The single-process behaviour is the default; the distributed engine
(:mod:`imitation_accum.distributed.engine`) overrides each hook.
"""

import contextlib
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch as th

from imitation_accum.engine import norm_replay
from imitation_accum.engine.task import ChunkLoss, TwoPassTask


class SingleProcessHooks:
    """How one process runs the parts of a step that a process group shares."""

    scaler: Optional[th.amp.GradScaler]

    @property
    def device(self) -> th.device:
        """The device of the net's parameters."""
        raise NotImplementedError

    def _loss_of_sums(
        self,
        task: TwoPassTask[Any],
        chunks: Sequence[Any],
        sums: th.Tensor,
        n_items: int,
    ) -> Tuple[ChunkLoss, th.Tensor]:
        """Two-pass: the batch's loss from pass 1's sums, and its gradient.

        The gradient is that of ``loss_sum / n_items`` with respect to ``sums``;
        pass 2 backpropagates it through each chunk. The default computes both from
        this process's sums. That is the global batch's loss gradient restricted to
        this process's items whenever each item's loss depends on its own sums
        only, as with fragment pairs split among processes by whole pairs; a
        subclass whose items couple across processes would all-gather ``sums``
        here, compute the loss over the global batch, and return its share.

        Args:
            task: The two-pass task.
            chunks: This process's chunks of the batch.
            sums: Every group sum of this process's items, from pass 1.
            n_items: Items in the whole batch (the loss divisor).

        Returns:
            The batch's losses (detached) and the gradient, shaped like ``sums``.
        """
        leaf = sums.detach().requires_grad_(True)
        with th.enable_grad():
            out = task.loss_of_sums(chunks, leaf)
            (grad,) = th.autograd.grad(out.loss_sum / n_items, leaf)
        detached = ChunkLoss(
            out.loss_sum.detach(),
            out.item_losses.detach(),
            {name: value.detach() for name, value in out.metric_sums.items()},
        )
        return detached, grad

    def _chunk_context(
        self, index: int, n_chunks: int
    ) -> contextlib.AbstractContextManager:
        """Context for chunk ``index``'s forward/backward (DDP: ``no_sync``)."""
        del index, n_chunks
        return contextlib.nullcontext()

    def _backward(self, loss: th.Tensor) -> None:
        """Backpropagates one chunk's share of the batch loss (scaled for float16)."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def _global_sum(self, value: th.Tensor) -> th.Tensor:
        """Sums a per-process figure over all processes of a step."""
        return value

    def _join_without_items(self) -> None:
        """Takes part in a step in which this process has no items (DDP)."""

    def _global_means(
        self,
        sums: Mapping[str, th.Tensor],
        names: Sequence[str],
        n_items: int,
    ) -> Dict[str, float]:
        """Sums of every metric over all processes, divided by ``n_items``."""
        keys = list(dict.fromkeys([*names, *sums]))
        device = self.device
        return {
            k: float(self._global_sum(th.as_tensor(sums.get(k, 0.0), device=device)))
            / n_items
            for k in keys
        }

    def _all_reduce_moments(
        self,
        moments: norm_replay.CallMoments,
    ) -> norm_replay.CallMoments:
        """Merges norm-input moments gathered by every process."""
        return moments
