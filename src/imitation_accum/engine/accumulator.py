"""The accumulate-then-step loop shared by every trainer of the package.

A task computes each chunk's outputs and loss; the engine runs a plan's chunks in
one or two passes and does what happens once per batch after the last chunk.
"""

import contextlib
import dataclasses
import resource
import sys
import time
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
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
    """Detached metrics summed over the chunk's items."""
    item_outputs: Optional[th.Tensor] = None
    """Detached per-item outputs the caller wants back (discriminator logits)."""


class AccumulationTask(Protocol[ChunkT_contra]):
    """The model-specific half of a step: what a chunk computes."""

    @property
    def metric_names(self) -> Sequence[str]:
        """The keys of ``metric_sums`` (reported even by a process without items)."""

    def forward(self, chunk: ChunkT_contra) -> Any:
        """``chunk``'s outputs (with ``float()``), in the calls its plan gives."""

    def loss(self, chunk: ChunkT_contra, outputs: Any) -> ChunkLoss:
        """Computes the chunk's item losses from its outputs."""


class TwoPassTask(AccumulationTask[ChunkT_contra], Protocol):
    """A task whose chunks may split items: the two-pass method.

    Pass 1 adds up, without gradient, each item's group sums (linear in the
    outputs); pass 2 re-runs each chunk with gradient and backpropagates
    ``partial_sums . d loss / d sums``, drawing pass 1's dropout masks.
    """

    def partial_sums(self, chunk: ChunkT_contra, outputs: th.Tensor) -> th.Tensor:
        """The chunk's contribution (linear in ``outputs``) to every group sum."""

    def loss_of_sums(
        self, chunks: Sequence[ChunkT_contra], sums: th.Tensor
    ) -> ChunkLoss:
        """The loss of every item of the batch, from all its group sums."""


@dataclasses.dataclass(frozen=True)
class Update:
    """What a step does once, after its last chunk: the trainer's, read per step."""

    optimizer: th.optim.Optimizer
    """Stepped once per batch."""
    regularizer: Optional[regularizers.Regularizer] = None
    """imitation regularizer, applied once per step."""
    max_grad_norm: Optional[float] = None
    """If given, the gradient norm is clipped to it once per step."""

    @property
    def params(self) -> List[th.Tensor]:
        """The parameters the optimizer updates."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]


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
    n_chunks: int
    seconds: float
    peak_memory_bytes: int
    two_pass: bool = False
    skipped: bool = False
    """float16: the scaled gradients overflowed and the step was skipped."""
    loss_scale: Optional[float] = None
    """float16: the gradient scale after the step."""
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

    Each chunk's summed loss is divided by the batch's item count, so the
    accumulated gradient is the full-batch gradient whatever the split. The
    :class:`Update` (regularizer, clipping, optimizer step) runs once, after the
    last chunk; a step that fails leaves no trace. The distributed engine overrides
    the hooks ``_chunk_context``, ``_backward``, ``_global_sum``,
    ``_join_without_items`` and ``_all_reduce_moments``.

    Args:
        net: The reward net; its ``RunningNorm``/``EMANorm`` layers get
            full-batch statistics.
        autocast_dtype: As for :meth:`configure`.
        activation_checkpointing: As for :meth:`configure`.

    Raises:
        ValueError: if ``net`` holds a layer that couples the items of a batch.

    Example:
        >>> engine = GradientAccumulator(net)  # doctest: +SKIP
        >>> result = engine.step(  # doctest: +SKIP
        ...     task, chunks, plan=plan, n_items=32, update=Update(optimizer)
        ... )
        >>> result.loss, result.grad_norm  # doctest: +SKIP
    """

    def __init__(
        self,
        net: nn.Module,
        *,
        autocast_dtype: Optional[th.dtype] = None,
        activation_checkpointing: bool = False,
    ) -> None:
        self.net = net
        self.forward_module: nn.Module = net
        """What tasks call after ``preprocess``: the net (DDP: its wrapper)."""
        self.norms = norm_replay.NormReplay(net)
        self.n_steps = 0
        self.n_skipped_steps = 0
        """float16 steps skipped for overflowing gradients."""
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
            autocast_dtype: ``None``, ``torch.bfloat16`` or ``torch.float16``:
                forwards run under ``torch.autocast`` in it; float16 adds a
                ``GradScaler`` (unscale, clip, step and update once per batch).
            activation_checkpointing: Run the net's CNN stacks under
                non-reentrant checkpointing in forwards with gradient.

        Raises:
            ValueError: if checkpointing is asked for and the net has no CNN stack.
        """
        self.autocast_dtype = autocast_dtype
        self.scaler = (
            th.amp.GradScaler(self.device.type)
            if autocast_dtype == th.float16
            else None
        )
        self._scaler_pending = False
        self.checkpointed: List[nn.Module] = []
        if activation_checkpointing:
            acceleration.check_checkpointable(self.net)
            self.checkpointed = acceleration.checkpointable_cnns(self.net)

    def forward_context(self, *, grad: bool) -> contextlib.AbstractContextManager:
        """Context for reward-net forwards: autocast, and checkpointing if ``grad``."""
        stack = contextlib.ExitStack()
        if self.autocast_dtype is not None:
            stack.enter_context(
                th.autocast(self.device.type, dtype=self.autocast_dtype)
            )
        if grad and self.checkpointed:
            stack.enter_context(acceleration.checkpointing(self.checkpointed))
        return stack

    def measuring(self, *, checkpointing: bool = True) -> contextlib.ExitStack:
        """Context of probing calls: a step's forwards, leaving RNG and norms alone.

        Checkpointing applies as with gradient if ``checkpointing``.
        """
        stack = contextlib.ExitStack()
        stack.enter_context(forked_rng(self.device))
        stack.enter_context(self.norms.frozen())
        stack.enter_context(self.forward_context(grad=checkpointing))
        return stack

    @property
    def device(self) -> th.device:
        """The device of the net's parameters."""
        return next((p.device for p in self.net.parameters()), th.device("cpu"))

    def step(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        *,
        plan: StepPlan,
        n_items: int,
        update: Update,
    ) -> StepResult:
        """Runs one optimizer step over ``chunks``, as ``plan`` lays it out.

        Args:
            task: Computes each chunk's outputs and loss.
            chunks: The batch, cut as ``plan`` says.
            plan: The step's plan.
            n_items: Items in the whole batch (the loss divisor).
            update: What happens once after the last chunk.

        Returns:
            The step's full-batch figures.

        Raises:
            FloatingPointError: if the loss or the gradient is not finite. After
                this or any error before the optimizer steps (such as out of
                memory), all training state and the torch RNG are as before.
        """
        device = self.device
        start = time.perf_counter()
        if device.type == "cuda":
            th.cuda.reset_peak_memory_stats(device)
        update.optimizer.zero_grad(set_to_none=True)
        norm_snapshot = self.norms.snapshot()
        rewind_rng = _rng_rewinder(device)
        scaler_snapshot = self.scaler.state_dict() if self.scaler else None
        try:
            result = self._step(task, chunks, plan, n_items, update)
        except BaseException:
            update.optimizer.zero_grad(set_to_none=True)
            self.norms.restore(norm_snapshot)
            rewind_rng()
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
        plan: StepPlan,
        n_items: int,
        update: Update,
    ) -> StepResult:
        params = update.params
        stats = None
        # Two passes would each update the norm layers: always replay instead.
        if self.norms.active and (plan.net_calls > 1 or plan.two_pass):
            stats = self._gather_norm_statistics(task, chunks)
        with self.norms.replaying(stats) if stats else contextlib.nullcontext():
            if plan.two_pass:
                outs = self._two_pass(task, chunks, n_items)  # type: ignore[arg-type]
            else:
                outs = self._one_pass(task, chunks, n_items)
        if not chunks:
            self._join_without_items()
        losses = (
            th.stack([out.loss_sum.detach() for out in outs]) if outs else th.zeros(0)
        )
        total = float(self._global_sum(losses.sum()))
        if not np.isfinite(total):
            if not th.isfinite(losses).all():
                bad = f"minibatch {int(th.nonzero(~th.isfinite(losses))[0, 0])}"
            else:
                bad = "another process's minibatch"
            raise FloatingPointError(
                f"non-finite loss at step {self.n_steps} in {bad} of "
                f"{len(chunks)}; the step was discarded"
            )
        overflow = False
        if self.scaler is not None:
            self.scaler.unscale_(update.optimizer)
            self._scaler_pending = True
            overflow = not bool(th.isfinite(total_norm(params)))
        elif update.regularizer is not None and not th.isfinite(total_norm(params)):
            raise FloatingPointError(
                f"non-finite gradient at step {self.n_steps} after {len(chunks)} "
                "minibatches; the step was discarded"
            )
        if stats is not None:
            self.norms.commit(stats)
        mean_loss = total / n_items
        if overflow:
            # GradScaler skips the step and lowers the scale; so are the
            # regularizer and clipping skipped.
            grad_norm = float(total_norm(params))
        else:
            if update.regularizer is not None:
                regularize(update.regularizer, params, mean_loss, self.device)
            grad_norm = clip_and_measure(params, update.max_grad_norm)
            if not np.isfinite(grad_norm):
                raise FloatingPointError(
                    f"non-finite gradient norm at step {self.n_steps} after "
                    f"{len(chunks)} minibatches; the step was discarded"
                )
        loss_scale = None
        if self.scaler is not None:
            self.scaler.step(update.optimizer)
            self.scaler.update()
            self._scaler_pending = False
            loss_scale = float(self.scaler.get_scale())
            self.n_skipped_steps += int(overflow)
        else:
            update.optimizer.step()
        item_outputs = [
            out.item_outputs for out in outs if out.item_outputs is not None
        ]
        return StepResult(
            loss=mean_loss,
            item_losses=_item_losses(outs),
            metrics=self._global_means(outs, task.metric_names, n_items),
            grad_norm=grad_norm,
            n_items=n_items,
            n_chunks=len(chunks),
            seconds=0.0,
            peak_memory_bytes=0,
            two_pass=plan.two_pass,
            skipped=overflow,
            loss_scale=loss_scale,
            item_outputs=th.cat(item_outputs) if item_outputs else None,
        )

    def _one_pass(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        n_items: int,
    ) -> List[ChunkLoss]:
        outs = []
        for index, chunk in enumerate(chunks):
            with self._chunk_context(index, len(chunks)):
                with self.forward_context(grad=True):
                    outputs = task.forward(chunk)
                out = task.loss(chunk, outputs.float())
                self._backward(out.loss_sum / n_items)
            outs.append(out)
        return outs

    def _two_pass(
        self,
        task: TwoPassTask[ChunkT],
        chunks: Sequence[ChunkT],
        n_items: int,
    ) -> List[ChunkLoss]:
        if not chunks:
            return []
        rewind_rng = _rng_rewinder(self.device)  # pass 2 draws pass 1's masks
        sums: Any = 0
        with th.no_grad(), self.forward_context(grad=False):
            for chunk in chunks:
                sums = sums + task.partial_sums(chunk, task.forward(chunk).float())
        # The gradient of this process's loss with respect to its own sums: exact
        # while each item's loss depends on its own sums (pairs are split whole).
        leaf = sums.detach().requires_grad_(True)
        with th.enable_grad():
            out = task.loss_of_sums(chunks, leaf)
            (sums_grad,) = th.autograd.grad(out.loss_sum / n_items, leaf)
        rewind_rng()
        sums_again: Any = 0
        for index, chunk in enumerate(chunks):
            with self._chunk_context(index, len(chunks)):
                with self.forward_context(grad=True):
                    outputs = task.forward(chunk)
                part = task.partial_sums(chunk, outputs.float())
                self._backward(th.dot(part, sums_grad))
            sums_again = sums_again + part.detach()
        # The gradient comes from pass 2's forwards: a non-finite loss of their
        # sums (pass 1's finite) must fail the step as one pass's does. Adding 0
        # times it keeps pass 1's loss, or makes it NaN for the step's check.
        pass_two_loss = task.loss_of_sums(chunks, sums_again).loss_sum.detach()
        loss_sum = out.loss_sum.detach() + 0 * pass_two_loss
        metrics = {name: value.detach() for name, value in out.metric_sums.items()}
        return [ChunkLoss(loss_sum, out.item_losses.detach(), metrics)]

    def _gather_norm_statistics(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
    ) -> norm_replay.ReplayedStatistics:
        """No-grad pre-pass(es) giving every norm call its full-batch statistics."""

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
                    task.forward(chunk)
            return self._all_reduce_moments(moments)

        return norm_replay.settled_statistics(self.norms, gather)

    def evaluate(
        self,
        task: AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        *,
        n_items: int,
    ) -> EvaluationResult:
        """Full-batch loss and metrics without gradient, in evaluation mode.

        ``chunks`` hold whole items, ``n_items`` in all (over all processes).
        """
        with (
            th.no_grad(),
            networks.evaluating(self.net),
            self.forward_context(grad=False),
        ):
            outs = [task.loss(chunk, task.forward(chunk).float()) for chunk in chunks]
        losses = _item_losses(outs)
        total = self._global_sum(th.as_tensor(losses.sum(), dtype=th.float64))
        return EvaluationResult(
            loss=float(total) / n_items,
            item_losses=losses,
            metrics=self._global_means(outs, task.metric_names, n_items),
        )

    def _chunk_context(
        self, index: int, n_chunks: int
    ) -> contextlib.AbstractContextManager:
        """Context for chunk ``index``'s forward/backward (DDP: ``no_sync``)."""
        return contextlib.nullcontext()

    def _backward(self, loss: th.Tensor) -> None:
        """Backpropagates one chunk's share of the batch loss (scaled for float16)."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def _global_sum(self, value: th.Tensor) -> th.Tensor:
        """Sums a per-process figure over all processes of a step."""
        return value

    def _join_without_items(self) -> None:
        """Takes part in a step in which this process has no items (DDP)."""

    def _global_means(
        self, outs: Sequence[ChunkLoss], names: Sequence[str], n_items: int
    ) -> Dict[str, float]:
        """Each metric summed over the chunks and all processes, over ``n_items``."""
        means = {}
        for name in dict.fromkeys([*names, *(n for o in outs for n in o.metric_sums)]):
            values = [o.metric_sums[name] for o in outs if name in o.metric_sums]
            total = th.as_tensor(sum(values, 0.0), device=self.device)
            means[name] = float(self._global_sum(total)) / n_items
        return means

    def _all_reduce_moments(
        self, moments: norm_replay.CallMoments
    ) -> norm_replay.CallMoments:
        """Merges norm-input moments gathered by every process."""
        return moments


def _rng_rewinder(device: th.device) -> Callable[[], None]:
    """Puts the CPU and (on CUDA) ``device``'s RNG back where they are now."""
    cpu = th.get_rng_state()
    cuda = th.cuda.get_rng_state(device) if device.type == "cuda" else None

    def rewind() -> None:
        th.set_rng_state(cpu)
        if cuda is not None:
            th.cuda.set_rng_state(cuda, device)

    return rewind


def forked_rng(device: th.device) -> contextlib.AbstractContextManager:
    """Runs a block with the torch RNG of ``device`` restored afterwards."""
    return th.random.fork_rng(
        devices=[device.index or 0] if device.type == "cuda" else []
    )


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

    A leaf on ``device`` stands for the batch loss; a weight regularizer's in-place
    decay of ``params`` is undone if it fails.
    """
    saved = None
    if not isinstance(regularizer, regularizers.LossRegularizer):
        saved = [p.detach().clone() for p in params]
    try:
        regularizer.regularize_and_backward(
            th.tensor(mean_loss, device=device, requires_grad=True)
        )
    except BaseException:
        if saved is not None:
            with th.no_grad():
                for p, old in zip(params, saved):
                    p.copy_(old)
        raise


def clip_and_measure(
    params: Sequence[th.Tensor], max_grad_norm: Optional[float]
) -> float:
    """The total gradient norm before clipping; clips to ``max_grad_norm`` if given."""
    grads = [p for p in params if p.grad is not None]
    if max_grad_norm is None or not grads:
        return float(total_norm(params))
    return float(th.nn.utils.clip_grad_norm_(grads, max_grad_norm))


def peak_memory_bytes(device: th.device) -> int:
    """Peak memory: CUDA's since the step began, elsewhere the process's peak RSS."""
    if device.type == "cuda":
        return int(th.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # KiB on Linux


def synchronize(device: th.device) -> None:
    """Waits for queued work on ``device``, so that wall-clock timings are real."""
    if device.type == "cuda":
        th.cuda.synchronize(device)


def _item_losses(outs: Sequence[ChunkLoss]) -> np.ndarray:
    if not outs:
        return np.zeros(0, dtype=np.float32)
    return th.cat([out.item_losses for out in outs]).cpu().numpy()
