"""The accumulate-then-step loop shared by every trainer of the package.

One optimizer step sees a *batch* of items (fragment pairs, or transitions); the
batch is cut into *chunks* and each chunk runs one forward/backward. The loss of a
chunk is the **sum** of its items' losses divided by the number of items in the
batch, so that uneven chunks are weighted by their size and the accumulated gradient
is the full-batch gradient, whatever the split. Everything that must happen once
per batch happens after the last chunk: the regularizer, clipping, the optimizer
step. A step that fails leaves no trace.

The engine knows nothing about fragments or discriminators: a task supplies the
forward of a chunk and the loss of a chunk's outputs (see :class:`AccumulationTask`).

**Two-pass steps.** When even one item does not fit in memory (a pair of long
fragments of large frames), the planner cuts the batch into chunks that split
items and says so in the step plan (see :class:`TwoPassTask`). Pass 1 runs every
chunk without gradient and adds up each item's per-group sums (a fragment's
return); the loss and its gradient with respect to those sums are computed once,
over the whole batch (:meth:`GradientAccumulator._loss_of_sums`); pass 2 re-runs
each chunk with gradient and backpropagates ``partial_sums . d loss / d sums``,
which by the chain rule accumulates exactly the full-batch gradient. The torch RNG
is rewound between the passes, so both draw the same dropout masks (the passes
make the same net calls with the same shapes), and both normalize with the same
replayed ``RunningNorm``/``EMANorm`` statistics (the pre-pass always runs).

**Precision and checkpointing.** :meth:`GradientAccumulator.configure` sets an
autocast dtype for every reward-net forward (float16 brings a ``GradScaler``: each
chunk's loss is scaled, and unscaling, clipping, the step and the scale update
happen once per batch; a step with overflowing gradients is skipped and counted)
and activation checkpointing of CNN reward nets.
"""

import contextlib
import time
from typing import Dict, Generic, List, Optional, Sequence, TypeVar

import numpy as np
import torch as th
from imitation.regularization import regularizers
from torch import nn

from imitation_accum.engine import (
    checkpointing,
    evaluation,
    gradients,
    norm_replay,
    observability,
    precision,
    rng,
)
from imitation_accum.engine.process_hooks import SingleProcessHooks
from imitation_accum.engine.task import (
    AccumulationTask,
    ChunkLoss,
    EvaluationResult,
    StepResult,
    TwoPassTask,
    concat_losses,
)
from imitation_accum.planning.plan import StepPlan

ChunkT = TypeVar("ChunkT")


class GradientAccumulator(SingleProcessHooks, Generic[ChunkT]):
    """Accumulates gradients over chunks and steps once per batch.

    Args:
        net: The reward net every reward-net call invokes; its
            ``RunningNorm``/``EMANorm`` layers get full-batch statistics.
        optimizer: The optimizer to step once per batch.
        regularizer: imitation regularizer applied once per step, after the last
            chunk (``regularize_and_backward`` is called with the batch's loss).
        max_grad_norm: If given, the total gradient norm is clipped to it once per
            step.
        autocast_dtype: Run reward-net forwards under ``torch.autocast`` in this
            dtype (see :meth:`configure`).
        activation_checkpointing: Checkpoint the CNN stacks of the net (see
            :meth:`configure`).

    Raises:
        ValueError: if ``net`` holds a layer that couples the items of a batch.

    Example:
        >>> engine = GradientAccumulator(net, optimizer)  # doctest: +SKIP
        >>> result = engine.step(  # doctest: +SKIP
        ...     task, chunks, plan=plan, n_items=32
        ... )
        >>> result.loss, result.grad_norm  # doctest: +SKIP
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: th.optim.Optimizer,
        *,
        regularizer: Optional[regularizers.Regularizer] = None,
        max_grad_norm: Optional[float] = None,
        autocast_dtype: Optional[th.dtype] = None,
        activation_checkpointing: bool = False,
    ) -> None:
        self.net = net
        self.optimizer = optimizer
        self.regularizer = regularizer
        self.max_grad_norm = max_grad_norm
        self.norms = norm_replay.NormReplay(net)
        self.n_steps = 0
        self.n_skipped_steps = 0
        self._device: Optional[th.device] = None
        self.configure(
            autocast_dtype=autocast_dtype,
            activation_checkpointing=activation_checkpointing,
        )

    def configure(
        self,
        *,
        autocast_dtype: Optional[th.dtype] = None,
        activation_checkpointing: bool = False,
    ) -> None:
        """Sets the precision of reward-net forwards and activation checkpointing.

        Args:
            autocast_dtype: ``None`` (full precision), ``torch.bfloat16`` or
                ``torch.float16``; every reward-net forward of a step (the norm
                pre-pass, both passes of a two-pass step, evaluation) runs under
                ``torch.autocast`` in it. float16 adds a ``GradScaler``.
            activation_checkpointing: Run the convolution stacks of the net's CNN
                reward nets under non-reentrant checkpointing in forwards with
                gradient.

        Raises:
            ValueError: if checkpointing is asked for and the net has no CNN stack.
        """
        self.autocast_dtype = autocast_dtype
        self.scaler = precision.make_grad_scaler(autocast_dtype, self.device)
        self._scaler_pending = False
        self.checkpointed: List[nn.Module] = []
        if activation_checkpointing:
            checkpointing.check_checkpointable(self.net)
            self.checkpointed = checkpointing.checkpointable_cnns(self.net)

    def forward_context(self, *, grad: bool) -> contextlib.AbstractContextManager:
        """Context for reward-net forwards: autocast, and checkpointing with grad.

        Args:
            grad: Whether the forward records a graph for a backward.

        Returns:
            The context manager.
        """
        if self.autocast_dtype is None and not (grad and self.checkpointed):
            return contextlib.nullcontext()  # the common case, once per chunk
        stack = contextlib.ExitStack()
        if self.autocast_dtype is not None:
            stack.enter_context(
                th.autocast(self.device.type, dtype=self.autocast_dtype),
            )
        if grad and self.checkpointed:
            stack.enter_context(checkpointing.checkpointing(self.checkpointed))
        return stack

    def measuring(self, *, checkpointing: bool = True) -> contextlib.ExitStack:
        """Context of timing and probing calls of the net.

        They leave no trace on the RNG or the norm statistics, and run as a step's
        forwards run: under autocast, and checkpointed unless ``checkpointing``
        is false.

        Args:
            checkpointing: Whether to checkpoint as forwards with gradient do.

        Returns:
            The context manager.
        """
        stack = contextlib.ExitStack()
        stack.enter_context(rng.forked_rng(self.device))
        stack.enter_context(self.norms.frozen())
        stack.enter_context(self.forward_context(grad=checkpointing))
        return stack

    @property
    def params(self) -> List[th.Tensor]:
        """The parameters the optimizer updates."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    @property
    def device(self) -> th.device:
        """The device of the net's parameters (read once per step)."""
        if self._device is None:
            self._device = next(
                (p.device for p in self.net.parameters()),
                th.device("cpu"),
            )
        return self._device

    def step(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        *,
        plan: StepPlan,
        n_items: int,
    ) -> StepResult:
        """Runs one optimizer step over ``chunks``, as ``plan`` lays it out.

        Args:
            task: Computes each chunk's outputs and loss.
            chunks: The batch, cut as ``plan`` says: chunks of whole items (one
                pass), or of transitions that may split items (two passes).
            plan: The planner's plan of the step: passes, transitions per
                reward-net call, and the calls in all (with a single call, norm
                layers update themselves, as in the reference forward).
            n_items: Items in the whole batch (the loss divisor).

        Returns:
            The step's full-batch figures.

        Raises:
            FloatingPointError: if the loss or the gradient is not finite; the
                parameters, norm buffers, optimizer state and torch RNG state are
                then as they were before the step (so are they after any other
                error, such as ``torch.cuda.OutOfMemoryError``, raised before the
                optimizer steps: the step can be redone).
        """
        self._device = None  # the net may have moved since the last step
        device = self.device
        start = time.perf_counter()
        observability.reset_peak_memory(device)
        self.optimizer.zero_grad(set_to_none=True)
        norm_snapshot = self.norms.snapshot()
        rng_snapshot = rng.RngState(device)
        scaler_snapshot = self.scaler.state_dict() if self.scaler else None
        try:
            result = self._step(task, chunks, plan=plan, n_items=n_items)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)
            self.norms.restore(norm_snapshot)
            rng_snapshot.restore()
            if self.scaler is not None and self._scaler_pending:
                # update() forgets this step's unscale record; the scale goes back.
                self.scaler.update()
                self.scaler.load_state_dict(scaler_snapshot or {})
                self._scaler_pending = False
            raise
        observability.synchronize(device)
        result.seconds = time.perf_counter() - start
        result.peak_memory_bytes = observability.peak_memory_bytes(device)
        self.n_steps += 1
        return result

    def _step(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        *,
        plan: StepPlan,
        n_items: int,
    ) -> StepResult:
        two_pass = plan.two_pass
        stats = None
        # Two passes would each update the norm layers: always replay instead.
        if self.norms.active and (plan.net_calls > 1 or two_pass):
            stats = self._gather_norm_statistics(task, chunks, plan.forward_size)
        replay = self.norms.replaying(stats) if stats else contextlib.nullcontext()
        loss_sums: List[th.Tensor] = []
        item_losses: List[th.Tensor] = []
        metric_sums: Dict[str, th.Tensor] = {}
        with replay:
            if two_pass:
                outs = self._two_pass(
                    task,  # type: ignore[arg-type]
                    chunks,
                    n_items,
                    plan.forward_size,
                )
            else:
                outs = self._one_pass(task, chunks, n_items, plan.forward_size)
        for out in outs:
            loss_sums.append(out.loss_sum.detach())
            item_losses.append(out.item_losses)
            for name, value in out.metric_sums.items():
                metric_sums[name] = metric_sums.get(name, 0) + value
        if not chunks:
            self._join_without_items()
        losses = th.stack(loss_sums) if loss_sums else th.zeros(0, device=self.device)
        total = float(self._global_sum(losses.sum()))
        if not np.isfinite(total):
            if not th.isfinite(losses).all():
                bad = f"minibatch {int(th.nonzero(~th.isfinite(losses))[0, 0])}"
            else:
                bad = "another process's minibatch"
            raise FloatingPointError(
                f"non-finite loss at step {self.n_steps} in {bad} of "
                f"{len(chunks)}; the step was discarded",
            )
        overflow = False
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
            self._scaler_pending = True
            overflow = not bool(th.isfinite(gradients.total_norm(self.params)))
        elif self.regularizer is not None:
            self._check_finite_grads(len(chunks))
        if stats is not None:
            self.norms.commit(stats)
        mean_loss = total / n_items
        if overflow:
            # The scaled gradients overflowed: GradScaler skips the step and
            # lowers the scale; the regularizer and clipping are skipped with it.
            grad_norm = float(gradients.total_norm(self.params))
        else:
            self._regularize(mean_loss)
            grad_norm = self._clip_and_measure()
            if not np.isfinite(grad_norm):
                raise FloatingPointError(
                    f"non-finite gradient norm at step {self.n_steps} after "
                    f"{len(chunks)} minibatches; the step was discarded",
                )
        loss_scale = None
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self._scaler_pending = False
            loss_scale = float(self.scaler.get_scale())
            self.n_skipped_steps += int(overflow)
        else:
            self.optimizer.step()
        return StepResult(
            loss=mean_loss,
            item_losses=concat_losses(item_losses),
            metrics=self._global_means(metric_sums, task.metric_names, n_items),
            grad_norm=grad_norm,
            n_items=n_items,
            n_minibatches=len(chunks),
            seconds=0.0,
            peak_memory_bytes=0,
            two_pass=two_pass,
            skipped=overflow,
            loss_scale=loss_scale,
            item_outputs=_concat_outputs(outs),
        )

    def _one_pass(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        n_items: int,
        forward_size: int,
    ) -> List[ChunkLoss]:
        """Forward, loss and backward of each chunk in turn (chunks of whole items)."""
        outs = []
        for index, chunk in enumerate(chunks):
            with self._chunk_context(index, len(chunks)):
                with self.forward_context(grad=True):
                    outputs = task.forward(chunk, forward_size)
                out = task.loss(chunk, outputs.float())
                self._backward(out.loss_sum / n_items)
            outs.append(out)
        return outs

    def _two_pass(
        self,
        task: TwoPassTask[ChunkT],
        chunks: Sequence[ChunkT],
        n_items: int,
        forward_size: int,
    ) -> List[ChunkLoss]:
        """The two-pass method (see the module's docstring); one loss for the batch."""
        if not chunks:
            return []
        # Pass 2 rewinds to here, so that it draws pass 1's dropout masks.
        start = rng.RngState(self.device)
        sums: Optional[th.Tensor] = None
        with th.no_grad():
            for chunk in chunks:
                with self.forward_context(grad=False):
                    outputs = task.forward(chunk, forward_size)
                part = task.partial_sums(chunk, outputs.float())
                sums = part if sums is None else sums + part
        assert sums is not None
        out, sums_grad = self._loss_of_sums(task, chunks, sums, n_items)
        start.restore()
        for index, chunk in enumerate(chunks):
            with self._chunk_context(index, len(chunks)):
                with self.forward_context(grad=True):
                    outputs = task.forward(chunk, forward_size)
                part = task.partial_sums(chunk, outputs.float())
                self._backward(th.dot(part, sums_grad))
        return [out]

    def _gather_norm_statistics(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        forward_size: int,
    ) -> norm_replay.ReplayedStatistics:
        """No-grad pre-pass(es) giving every norm call its full-batch statistics.

        A layer whose input depends on another norm layer's output needs the
        pre-pass repeated until the gathered moments stop changing; whether the
        net is like that is learnt on the first step by running a second pass.
        """

        def gather(
            provisional: Optional[norm_replay.CallStats],
        ) -> norm_replay.CallMoments:
            with (
                th.no_grad(),
                rng.forked_rng(self.device),
                self.norms.gathering(provisional) as moments,
                self.forward_context(grad=False),
            ):
                for chunk in chunks:
                    task.forward(chunk, forward_size)
            return self._all_reduce_moments(moments)

        return norm_replay.settled_statistics(self.norms, gather)

    def _check_finite_grads(self, n_chunks: int) -> None:
        if not th.isfinite(gradients.total_norm(self.params)):
            raise FloatingPointError(
                f"non-finite gradient at step {self.n_steps} after {n_chunks} "
                "minibatches; the step was discarded",
            )

    def _regularize(self, mean_loss: float) -> None:
        if self.regularizer is not None:
            gradients.regularize(self.regularizer, self.params, mean_loss, self.device)

    def _clip_and_measure(self) -> float:
        return gradients.clip_and_measure(self.params, self.max_grad_norm)

    def evaluate(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        *,
        plan: StepPlan,
        n_items: int,
    ) -> EvaluationResult:
        """Full-batch loss and metrics without gradient, in evaluation mode.

        Evaluation mode freezes norm statistics and disables dropout, so the
        figures do not depend on how the items are split into chunks.

        Args:
            task: Computes each chunk's outputs and loss.
            chunks: The items to evaluate, cut into chunks of whole items.
            plan: The planner's plan (its ``forward_size`` is used).
            n_items: Items in all chunks (over all processes).

        Returns:
            Mean loss, per-item losses and mean metrics.
        """
        return evaluation.evaluate(self, task, chunks, plan=plan, n_items=n_items)


def _concat_outputs(outs: Sequence[ChunkLoss]) -> Optional[th.Tensor]:
    parts = [out.item_outputs for out in outs if out.item_outputs is not None]
    return th.cat(parts) if parts else None
