"""The accumulate-then-step loop shared by every trainer of the package.

One optimizer step sees a *batch* of items (fragment pairs, or transitions); the
batch is cut into *chunks* and each chunk runs one forward/backward. The loss of a
chunk is the **sum** of its items' losses divided by the number of items in the
batch, so that uneven chunks are weighted by their size and the accumulated gradient
is the full-batch gradient, whatever the split. Everything that must happen once
per batch happens after the last chunk: the regularizer, clipping, the optimizer
step. A step that fails leaves no trace.

The engine knows nothing about fragments or discriminators: a task supplies the
forward of a chunk and the loss of a chunk's outputs (see :class:`AccumulationTask`),
in calls of at most the plan's ``forward_size`` transitions. Data flows one way: a
task returns what it computes and never keeps state from one call to the next.

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
and activation checkpointing of CNN reward nets (both in
:mod:`imitation_accum.engine.acceleration`).

**Scale-out.** The parts of a step that a process group shares (the two-pass loss,
backward, sums of figures, norm moments) are methods that the distributed engine
(:mod:`imitation_accum.distributed.engine`) overrides; here they run in one process.
"""

import contextlib
import dataclasses
import resource
import sys
import time
from typing import (
    Any,
    Dict,
    Generic,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
)

import numpy as np
import torch as th
from imitation.regularization import regularizers
from imitation.util import networks
from torch import nn

from imitation_accum.engine import acceleration, norm_replay
from imitation_accum.planning.plan import StepPlan

ChunkT = TypeVar("ChunkT")
ChunkT_contra = TypeVar("ChunkT_contra", contravariant=True)


class ChunkLoss(NamedTuple):
    """What a task computes from one chunk's reward-net outputs."""

    loss_sum: th.Tensor
    """Sum of the chunk's per-item losses (a scalar that carries gradient)."""
    item_losses: th.Tensor
    """The per-item losses, detached."""
    metric_sums: Mapping[str, th.Tensor]
    """Detached metrics summed over the chunk's items (divided by the batch's
    item count to give full-batch means)."""
    item_outputs: Optional[th.Tensor] = None
    """Detached per-item outputs the caller wants back (discriminator logits)."""


class AccumulationTask(Protocol[ChunkT_contra]):
    """The model-specific half of a step: what a chunk computes.

    ``metric_names`` are the keys of its ``metric_sums``, so that a process with
    no items in a step still reports them.
    """

    @property
    def metric_names(self) -> Sequence[str]:
        """The keys of the task's ``metric_sums``."""

    def forward(self, chunk: ChunkT_contra, forward_size: int) -> Any:
        """Runs ``chunk`` through the net in calls of at most ``forward_size``.

        Returns a tensor, or several in a tuple-like with ``float()`` (one per
        side of a pair chunk); the engine only casts it to float32 for the loss.
        """

    def loss(self, chunk: ChunkT_contra, outputs: Any) -> ChunkLoss:
        """Computes the chunk's item losses from its outputs."""


class TwoPassTask(AccumulationTask[ChunkT_contra], Protocol):
    """A task whose chunks may split items: the two-pass method.

    Each item's loss must depend on the outputs only through per-group sums that
    are linear in the outputs (a fragment's discounted return).
    """

    def partial_sums(self, chunk: ChunkT_contra, outputs: th.Tensor) -> th.Tensor:
        """The chunk's contribution to every group sum of the batch.

        Linear in ``outputs``; the contributions of all chunks add up to the sums.
        """

    def loss_of_sums(
        self,
        chunks: Sequence[ChunkT_contra],
        sums: th.Tensor,
    ) -> ChunkLoss:
        """The loss of every item of the batch, from all its group sums."""


@dataclasses.dataclass
class StepResult:
    """Full-batch figures of one optimizer step."""

    loss: float
    """Mean per-item loss over the batch (before regularization)."""
    item_losses: np.ndarray
    """Per-item losses, in batch order."""
    metrics: Dict[str, float]
    """Each task metric summed over the batch, divided by the batch's item count."""
    grad_norm: float
    """Total gradient norm before clipping (after the regularizer)."""
    n_items: int
    n_minibatches: int
    seconds: float
    peak_memory_bytes: int
    two_pass: bool = False
    """Whether the step ran in two passes (chunks that split items)."""
    skipped: bool = False
    """float16 only: the scaled gradients overflowed and the step was skipped."""
    loss_scale: Optional[float] = None
    """float16 only: the gradient scale after the step's update."""
    item_outputs: Optional[th.Tensor] = None
    """The chunks' ``item_outputs``, concatenated in chunk order (one pass)."""


@dataclasses.dataclass
class EvaluationResult:
    """Full-batch figures of a no-grad evaluation."""

    loss: float
    item_losses: np.ndarray
    metrics: Dict[str, float]


class GradientAccumulator(Generic[ChunkT]):
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
        self.scaler = acceleration.make_grad_scaler(autocast_dtype, self.device)
        self._scaler_pending = False
        self.checkpointed: List[nn.Module] = []
        if activation_checkpointing:
            acceleration.check_checkpointable(self.net)
            self.checkpointed = acceleration.checkpointable_cnns(self.net)

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
            stack.enter_context(acceleration.checkpointing(self.checkpointed))
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
        stack.enter_context(forked_rng(self.device))
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
        reset_peak_memory(device)
        self.optimizer.zero_grad(set_to_none=True)
        norm_snapshot = self.norms.snapshot()
        rng_snapshot = RngState(device)
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
        synchronize(device)
        result.seconds = time.perf_counter() - start
        result.peak_memory_bytes = peak_memory_bytes(device)
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
        loss_sums = [out.loss_sum.detach() for out in outs]
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
            overflow = not bool(th.isfinite(total_norm(self.params)))
        elif self.regularizer is not None:
            self._check_finite_grads(len(chunks))
        if stats is not None:
            self.norms.commit(stats)
        mean_loss = total / n_items
        if overflow:
            # The scaled gradients overflowed: GradScaler skips the step and
            # lowers the scale; the regularizer and clipping are skipped with it.
            grad_norm = float(total_norm(self.params))
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
            item_losses=_item_losses(outs),
            metrics=self._global_means(_metric_sums(outs), task.metric_names, n_items),
            grad_norm=grad_norm,
            n_items=n_items,
            n_minibatches=len(chunks),
            seconds=0.0,
            peak_memory_bytes=0,
            two_pass=two_pass,
            skipped=overflow,
            loss_scale=loss_scale,
            item_outputs=_item_outputs(outs),
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
        start = RngState(self.device)
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
                forked_rng(self.device),
                self.norms.gathering(provisional) as moments,
                self.forward_context(grad=False),
            ):
                for chunk in chunks:
                    task.forward(chunk, forward_size)
            return self._all_reduce_moments(moments)

        return norm_replay.settled_statistics(self.norms, gather)

    def _check_finite_grads(self, n_chunks: int) -> None:
        if not th.isfinite(total_norm(self.params)):
            raise FloatingPointError(
                f"non-finite gradient at step {self.n_steps} after {n_chunks} "
                "minibatches; the step was discarded",
            )

    def _regularize(self, mean_loss: float) -> None:
        if self.regularizer is not None:
            regularize(self.regularizer, self.params, mean_loss, self.device)

    def _clip_and_measure(self) -> float:
        return clip_and_measure(self.params, self.max_grad_norm)

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
        outs = []
        with th.no_grad(), networks.evaluating(self.net):
            for chunk in chunks:
                with self.forward_context(grad=False):
                    outputs = task.forward(chunk, plan.forward_size)
                outs.append(task.loss(chunk, outputs.float()))
        losses = _item_losses(outs)
        total = self._global_sum(th.as_tensor(losses.sum(), dtype=th.float64))
        return EvaluationResult(
            loss=float(total) / n_items,
            item_losses=losses,
            metrics=self._global_means(_metric_sums(outs), task.metric_names, n_items),
        )

    # The parts of a step a process group shares; the distributed engine
    # overrides each of them.

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


class RngState:
    """The CPU and (on CUDA) device RNG states, for rewinding.

    Args:
        device: The device whose generator dropout draws from.
    """

    def __init__(self, device: th.device) -> None:
        self.cpu = th.get_rng_state()
        self.cuda = th.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device

    def restore(self) -> None:
        """Puts the generators back where they were when this was taken."""
        th.set_rng_state(self.cpu)
        if self.cuda is not None:
            th.cuda.set_rng_state(self.cuda, self.device)


def forked_rng(device: th.device) -> contextlib.AbstractContextManager:
    """Runs a block with the torch RNG of ``device`` restored afterwards."""
    devices = [device.index or 0] if device.type == "cuda" else []
    return th.random.fork_rng(devices=devices)


def total_norm(params: Sequence[th.Tensor]) -> th.Tensor:
    """The total 2-norm of the gradients of ``params`` (zero without any)."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return th.zeros(())
    get_total_norm = getattr(th.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if get_total_norm is not None:
        return get_total_norm(grads)
    return th.linalg.vector_norm(th.stack([th.linalg.vector_norm(g) for g in grads]))


def regularize(
    regularizer: regularizers.Regularizer,
    params: Sequence[th.Tensor],
    mean_loss: float,
    device: th.device,
) -> None:
    """Applies an imitation regularizer once, to the batch's mean loss.

    A leaf stands for the batch loss: loss regularizers add their penalty to it
    and backpropagate once; weight regularizers call backward on it (a no-op for
    the parameters) and decay the weights in place, which a failure undoes.

    Args:
        regularizer: The regularizer.
        params: The parameters it acts on.
        mean_loss: The batch's mean loss.
        device: The parameters' device.
    """
    saved = None
    if not isinstance(regularizer, regularizers.LossRegularizer):
        saved = [p.detach().clone() for p in params]
    try:
        batch_loss = th.tensor(mean_loss, device=device, requires_grad=True)
        regularizer.regularize_and_backward(batch_loss)
    except BaseException:
        if saved is not None:
            with th.no_grad():
                for p, old in zip(params, saved):
                    p.copy_(old)
        raise


def clip_and_measure(
    params: Sequence[th.Tensor],
    max_grad_norm: Optional[float],
) -> float:
    """The total gradient norm before clipping; clips to ``max_grad_norm`` if given."""
    if max_grad_norm is not None:
        grads = [p for p in params if p.grad is not None]
        if not grads:
            return 0.0
        return float(th.nn.utils.clip_grad_norm_(grads, max_grad_norm))
    return float(total_norm(params))


def reset_peak_memory(device: th.device) -> None:
    """Starts a new peak-memory window on ``device`` (CUDA only; see below)."""
    if device.type == "cuda":
        th.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: th.device) -> int:
    """Peak memory of the current window.

    On CUDA this is ``torch.cuda.max_memory_allocated`` since the last
    :func:`reset_peak_memory`; elsewhere it is the process's peak resident set
    size, which cannot be reset and so covers the whole process lifetime.

    Args:
        device: The device the reward net lives on.

    Returns:
        Peak memory in bytes.
    """
    if device.type == "cuda":
        return int(th.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def synchronize(device: th.device) -> None:
    """Waits for queued work on ``device``, so that wall-clock timings are real."""
    if device.type == "cuda":
        th.cuda.synchronize(device)


def _item_losses(outs: Sequence[ChunkLoss]) -> np.ndarray:
    """The chunks' per-item losses, in order, as one array."""
    if not outs:
        return np.zeros(0, dtype=np.float32)
    return th.cat([out.item_losses for out in outs]).cpu().numpy()


def _metric_sums(outs: Sequence[ChunkLoss]) -> Dict[str, th.Tensor]:
    """Each metric summed over the chunks."""
    sums: Dict[str, th.Tensor] = {}
    for out in outs:
        for name, value in out.metric_sums.items():
            sums[name] = sums.get(name, 0) + value
    return sums


def _item_outputs(outs: Sequence[ChunkLoss]) -> Optional[th.Tensor]:
    """The chunks' ``item_outputs``, in order; ``None`` if no chunk has any."""
    parts = [out.item_outputs for out in outs if out.item_outputs is not None]
    return th.cat(parts) if parts else None
