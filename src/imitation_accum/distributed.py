"""Reward-model training shared by the processes of a group (DDP).

One process per device, launched by ``torchrun``; gloo on CPUs, NCCL on GPUs. Every
process (*rank*) holds the whole reward net and the whole dataset and draws the
same batches from an identically seeded generator; each rank computes a disjoint,
contiguous share of every batch, split into minibatches as usual. The update is the
one a single process makes on the whole batch:

* a rank's minibatch losses are divided by the number of pairs in the *whole*
  batch, and multiplied by the number of ranks to undo DDP's averaging of
  gradients, so the reduced gradient is the full-batch gradient;
* gradients are reduced once per step: every minibatch but a rank's last runs
  under ``no_sync()``;
* ``RunningNorm``/``EMANorm`` statistics are those of the whole batch: the moments
  (count, mean, M2) each rank gathers are exchanged and merged in rank order, and
  every rank replays the same update. DDP's own buffer broadcast, which would copy
  rank 0's statistics over everyone's, is turned off;
* a rank with no pairs in a step (a last batch smaller than the number of ranks)
  runs the net on zero transitions, which contributes a zero gradient, so it still
  takes part in the reduction;
* losses, metrics and norm moments reported or used are sums over all ranks, and
  a ``forward_size="auto"`` is tuned on rank 0 alone and broadcast.

Parameters, buffers and optimizer state therefore stay identical on all ranks.

Chunks are planned per rank (``minibatch_size``, ``memory_budget``, two passes):
the collectives do not depend on how many chunks a rank runs, only on every rank
running its share of every step. A step that runs out of memory is not redone
(the single-process back-off would leave the other ranks waiting): the job stops
with the rank's error.
"""

import contextlib
import dataclasses
import hashlib
import inspect
import os
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

import numpy as np
import torch as th
import torch.distributed as dist
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers
from imitation.util import logger as imit_logger
from torch import nn
from torch.utils import data as data_th

from imitation_accum import (
    _validation,
    accumulation,
    normalization,
    preference,
    preference_data,
    preference_task,
)

ChunkT = TypeVar("ChunkT")

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_OUT_OF_MEMORY = getattr(th, "OutOfMemoryError", th.cuda.OutOfMemoryError)


class RankFailedError(RuntimeError):
    """A process of a distributed job failed; the message names its rank."""


@dataclasses.dataclass(frozen=True)
class DistributedContext:
    """Where this process stands in its job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: th.device = dataclasses.field(default_factory=lambda: th.device("cpu"))
    backend: Optional[str] = None
    """``"gloo"`` or ``"nccl"``; ``None`` for a single process."""
    owns_group: bool = False
    """Whether :func:`init_distributed` created the process group."""

    @property
    def distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that logs and writes files."""
        return self.rank == 0


def launched_by_torchrun(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the environment describes a process group (as ``torchrun`` sets it).

    Args:
        environ: The environment (default: ``os.environ``).

    Returns:
        True if ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` are set.
    """
    env = os.environ if environ is None else environ
    return all(name in env for name in _TORCHRUN_VARIABLES)


def resolve_device(device: Union[str, th.device], local_rank: int = 0) -> th.device:
    """The device this process trains on.

    Args:
        device: ``"auto"`` (this process's GPU if there is one, else the CPU),
            ``"cuda"`` (this process's GPU), or any explicit device.
        local_rank: The process's index on its machine, which picks its GPU.

    Returns:
        The device.

    Raises:
        ValueError: if ``device`` names no device, or CUDA is asked for but absent.
    """
    if isinstance(device, str) and device == "auto":
        device = "cuda" if th.cuda.is_available() else "cpu"
    try:
        resolved = th.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device must be 'auto' or a torch device, got {device!r}"
        ) from error
    if resolved.type == "cuda":
        if not th.cuda.is_available():
            raise ValueError(f"device={device!r}, but CUDA is not available")
        if resolved.index is None:
            resolved = th.device("cuda", local_rank % th.cuda.device_count())
    return resolved


def backend_for(device: th.device) -> str:
    """NCCL for GPUs, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(
    device: Union[str, th.device] = "auto",
    *,
    backend: Optional[str] = None,
) -> DistributedContext:
    """Joins the process group described by the environment, if there is one.

    Under ``torchrun`` this initializes ``torch.distributed`` (NCCL when training on
    GPUs, gloo on CPUs, unless ``backend`` says otherwise) and selects this
    process's GPU. An already initialized default group is used as it is. Without
    either, nothing is initialized: a single process.

    Args:
        device: See :func:`resolve_device`.
        backend: Force a backend.

    Returns:
        The process's context.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank)
    if resolved.type == "cuda":
        th.cuda.set_device(resolved)
    owns = False
    if not dist.is_initialized() and launched_by_torchrun():
        dist.init_process_group(backend or backend_for(resolved))
        owns = True
    if not dist.is_initialized():
        return DistributedContext(device=resolved)
    return DistributedContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=resolved,
        backend=str(dist.get_backend()),
        owns_group=owns,
    )


def shutdown_distributed(context: DistributedContext) -> None:
    """Leaves the process group, if :func:`init_distributed` created it."""
    if context.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def _record_for_torchrun(error: BaseException) -> None:
    # torchrun prints the error file of the first rank that failed in its summary.
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing import errors

        errors.ErrorHandler().record_exception(error)


@contextlib.contextmanager
def reporting_failures(context: DistributedContext) -> Iterator[None]:
    """Re-raises an error of a distributed run with this process's rank in it.

    The error is also recorded for ``torchrun``, whose summary then names the
    first rank that failed and its error; ``torchrun`` stops the other ranks and
    exits non-zero. In a single process errors pass through unchanged.

    Args:
        context: This process's context.

    Yields:
        None.

    Raises:
        RankFailedError: from any exception of the block, in a distributed run.
    """
    try:
        yield
    except Exception as error:
        if not context.distributed:
            raise
        failure = RankFailedError(
            f"rank {context.rank} of {context.world_size} failed: "
            f"{type(error).__name__}: {error}",
        )
        _record_for_torchrun(failure)
        raise failure from error


@contextlib.contextmanager
def distributed_session(
    device: Union[str, th.device] = "auto",
    *,
    backend: Optional[str] = None,
) -> Iterator[DistributedContext]:
    """:func:`init_distributed`, :func:`reporting_failures`, then a clean exit.

    The process group is left only after a successful block: after a failure
    another rank may still wait in a collective, and tearing NCCL down under it
    can hang; the process is about to exit anyway.

    Args:
        device: See :func:`resolve_device`.
        backend: Force a backend.

    Yields:
        This process's context.

    Example:
        >>> with distributed_session() as context:  # doctest: +SKIP
        ...     trainer = DistributedRewardTrainer(model, loss, rng)
        ...     trainer.train(dataset)
    """
    context = init_distributed(device, backend=backend)
    with reporting_failures(context):
        yield context
    shutdown_distributed(context)


def local_share(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous share of ``indices``.

    Shares differ in size by at most one (the first ranks get the extra items); a
    rank gets none when there are fewer items than ranks.

    Args:
        indices: The batch.
        rank: This process's rank.
        world_size: Number of processes.

    Returns:
        A contiguous slice of ``indices``.
    """
    base, extra = divmod(len(indices), world_size)
    start = rank * base + min(rank, extra)
    return indices[start : start + base + (rank < extra)]


def check_batch_size(name: str, batch_size: int, world_size: int) -> None:
    """Checks that every rank gets at least one item of a full batch.

    Args:
        name: The argument's name, for the message.
        batch_size: Items per batch.
        world_size: Number of processes.

    Raises:
        ValueError: if ``batch_size < world_size``.
    """
    if batch_size < world_size:
        raise ValueError(
            f"{name}={batch_size} is smaller than the number of processes "
            f"({world_size}): every process needs at least one pair of a full "
            "batch. Raise the batch size or start fewer processes.",
        )


class DistributedGradientAccumulator(accumulation.GradientAccumulator[ChunkT]):
    """A :class:`GradientAccumulator` whose steps are shared by a process group.

    Each rank passes its own chunks and the item count of the *whole* batch to
    :meth:`step`; the result is the step one process would take on the whole
    batch, applied on every rank.

    Args:
        net: The reward net; wrapped in :attr:`ddp`, through which every
            reward-net call of a task must go (DDP sees the backward only of
            outputs of its own forward).
        optimizer: The optimizer to step once per batch.
        empty_forward: Runs the module it is given (:attr:`ddp`) on zero items
            and returns the output; lets a rank with no items join a step.
        process_group: The group to share steps with (default: the default one).
        regularizer: As in :class:`GradientAccumulator`.
        max_grad_norm: As in :class:`GradientAccumulator`.

    Raises:
        RuntimeError: if ``torch.distributed`` is not initialized.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: th.optim.Optimizer,
        *,
        empty_forward: Callable[[nn.Module], th.Tensor],
        process_group: Optional[dist.ProcessGroup] = None,
        regularizer: Optional[regularizers.Regularizer] = None,
        max_grad_norm: Optional[float] = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "DistributedGradientAccumulator needs an initialized process group "
                "(see imitation_accum.distributed.init_distributed)",
            )
        super().__init__(
            net,
            optimizer,
            regularizer=regularizer,
            max_grad_norm=max_grad_norm,
        )
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        device = self.device
        nccl = dist.get_backend(process_group) == "nccl"
        self._comm_device = device if nccl else th.device("cpu")
        self.ddp = nn.parallel.DistributedDataParallel(
            net,
            device_ids=[device.index] if device.type == "cuda" else None,
            process_group=process_group,
            **self._ddp_options(),
        )
        self._empty_forward = empty_forward

    def _ddp_options(self) -> Dict[str, Any]:
        """Keyword arguments for ``DistributedDataParallel``: no buffer broadcast.

        DDP would copy rank 0's norm statistics over every rank's before each
        forward; here every rank computes the whole batch's statistics itself.
        Buffers are still made equal once, when DDP is built.
        """
        # torch 2.13 splits broadcast_buffers (at init and in forward) into
        # forward_sync_buffers (in forward only) and an init sync that stays on.
        parameters = inspect.signature(nn.parallel.DistributedDataParallel).parameters
        if "forward_sync_buffers" in parameters:
            return {"forward_sync_buffers": False}
        return {"broadcast_buffers": False}

    def step(
        self,
        task: accumulation.AccumulationTask[ChunkT],
        chunks: Sequence[ChunkT],
        *,
        n_items: int,
        net_calls: int,
    ) -> accumulation.StepResult:
        """Runs this rank's share of one optimizer step.

        Args:
            task: Computes each chunk's outputs and loss.
            chunks: This rank's share of the batch, split (may be empty).
            n_items: Items in the whole batch, over all ranks.
            net_calls: Reward-net calls this rank makes.

        Returns:
            The step's full-batch figures (``item_losses``: this rank's only).
        """
        calls = int(self._global_sum(th.tensor(float(net_calls))))
        if self.norms.active:
            # Always replay the norm update from every rank's moments, even when
            # one call would update the layers itself: every rank must end with
            # the same buffers, including ranks that see nothing.
            calls = max(calls, 2)
        try:
            return super().step(task, chunks, n_items=n_items, net_calls=calls)
        except _OUT_OF_MEMORY as error:
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
        with accumulation.forked_rng(self.device), self.norms.frozen():
            output = self._empty_forward(self.ddp)
            self._backward(output.sum())

    def _all_reduce_moments(
        self,
        moments: normalization.CallMoments,
    ) -> normalization.CallMoments:
        layers = self.norms.layers
        calls = th.tensor([float(len(c)) for c in moments], device=self._comm_device)
        dist.all_reduce(calls, op=dist.ReduceOp.MAX, group=self.process_group)
        n_calls = [int(n) for n in calls.tolist()]
        shapes = [tuple(layer.running_mean.shape) for layer in layers]
        widths = [int(np.prod(shape)) for shape in shapes]
        sizes = [n * (1 + 2 * w) for n, w in zip(n_calls, widths)]
        local = th.zeros(sum(sizes), dtype=th.float64, device=self._comm_device)
        offset = 0
        for layer_moments, n, w in zip(moments, n_calls, widths):
            for call in range(n):
                if call < len(layer_moments):
                    m = layer_moments[call]
                    local[offset] = m.count
                    local[offset + 1 : offset + 1 + w] = m.mean.reshape(-1)
                    local[offset + 1 + w : offset + 1 + 2 * w] = m.m2.reshape(-1)
                offset += 1 + 2 * w
        gathered = [th.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local, group=self.process_group)
        merged: normalization.CallMoments = []
        offset = 0
        for n, w, shape in zip(n_calls, widths, shapes):
            layer_calls = []
            for _ in range(n):
                total: Optional[normalization.Moments] = None
                for buffer in gathered:  # in rank order, the same on every rank
                    part = self._unpack_moments(buffer[offset : offset + 1 + 2 * w])
                    if part is not None:
                        part.mean = part.mean.reshape(shape)
                        part.m2 = part.m2.reshape(shape)
                        total = part if total is None else total.merge(part)
                assert total is not None  # some rank made this call
                layer_calls.append(total)
                offset += 1 + 2 * w
            merged.append(layer_calls)
        return merged

    def _unpack_moments(self, packed: th.Tensor) -> Optional[normalization.Moments]:
        """``[count, mean..., m2...]`` as moments on the net's device; None if empty."""
        count = int(packed[0])
        if count == 0:
            return None
        mean, m2 = packed[1:].to(self.device).chunk(2)
        return normalization.Moments(count, mean, m2)

    def broadcast(self, values: Sequence[float], src: int = 0) -> Tuple[float, ...]:
        """Rank ``src``'s ``values`` on every rank.

        Args:
            values: Numbers (only rank ``src``'s matter; same length everywhere).
            src: The rank whose values win.

        Returns:
            The values of rank ``src``.
        """
        tensor = th.tensor(list(values), dtype=th.float64, device=self._comm_device)
        dist.broadcast(tensor, src, group=self.process_group)
        return tuple(tensor.tolist())


class DistributedRewardTrainer(preference.CrossEntropyRewardTrainer):
    """A :class:`CrossEntropyRewardTrainer` that shares each step among processes.

    Arguments and results are those of :class:`CrossEntropyRewardTrainer`; the
    trained net, its norm statistics and every logged figure equal those of one
    process training on the same data (up to float round-off). ``batch_size`` and
    ``minibatch_size`` keep their meaning: ``batch_size`` pairs per optimizer step
    over all ranks, at most ``minibatch_size`` pairs per forward/backward on each.

    Every rank must build the trainer with the same arguments and an identically
    seeded ``rng``, and call :meth:`train` with the same dataset. Outside a
    process group (or in a group of one) this is a plain
    :class:`CrossEntropyRewardTrainer`.

    Only rank 0 shows a progress bar; give the other ranks a logger that writes
    nothing worth keeping.

    Args:
        preference_model: As in :class:`CrossEntropyRewardTrainer`.
        loss: As in :class:`CrossEntropyRewardTrainer`.
        rng: As in :class:`CrossEntropyRewardTrainer`; seeded the same on every rank.
        batch_size: As in :class:`CrossEntropyRewardTrainer`; at least the number of
            processes.
        minibatch_size: As in :class:`CrossEntropyRewardTrainer`.
        epochs: As in :class:`CrossEntropyRewardTrainer`.
        lr: As in :class:`CrossEntropyRewardTrainer`.
        custom_logger: As in :class:`CrossEntropyRewardTrainer`.
        regularizer_factory: As in :class:`CrossEntropyRewardTrainer`.
        process_group: The group to share steps with (default: the default group,
            if ``torch.distributed`` is initialized).
        **kwargs: Further keyword arguments of :class:`CrossEntropyRewardTrainer`.

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
        preference_model: pc.PreferenceModel,
        loss: pc.RewardLoss,
        rng: np.random.Generator,
        batch_size: int = 32,
        minibatch_size: Optional[int] = None,
        epochs: int = 1,
        lr: float = 1e-3,
        custom_logger: Optional[imit_logger.HierarchicalLogger] = None,
        regularizer_factory: Optional[regularizers.RegularizerFactory] = None,
        *,
        process_group: Optional[dist.ProcessGroup] = None,
        **kwargs: Any,
    ) -> None:
        self.process_group = process_group
        distributed = dist.is_initialized()
        self.world_size = dist.get_world_size(process_group) if distributed else 1
        self.rank = dist.get_rank(process_group) if distributed else 0
        check_batch_size(
            "batch_size",
            _validation.positive_int("batch_size", batch_size),
            self.world_size,
        )
        if self.rank != 0:
            kwargs["progress_bar"] = False
        # Rank 0's forward-size choice, (size, whether calls span whole chunks).
        self._agreed_forward_size: Optional[Tuple[int, bool]] = None
        super().__init__(
            preference_model,
            loss,
            rng,
            batch_size,
            minibatch_size,
            epochs,
            lr,
            custom_logger,
            regularizer_factory,
            **kwargs,
        )
        if self.distributed:
            self._check_same_rng()

    @property
    def distributed(self) -> bool:
        """Whether steps are shared with other processes."""
        return self.world_size > 1

    def _make_engine(self) -> accumulation.GradientAccumulator:
        if not self.distributed:
            return super()._make_engine()
        engine: DistributedGradientAccumulator = DistributedGradientAccumulator(
            self._preference_model.model,
            self.optim,
            empty_forward=self._empty_forward,
            process_group=self.process_group,
            regularizer=self.regularizer,
            max_grad_norm=self.max_grad_norm,
        )
        # preprocess stays on the net; the call itself goes through DDP.
        self._task.call_target = engine.ddp
        return engine

    def _local_items(self, indices: np.ndarray) -> np.ndarray:
        return local_share(indices, self.rank, self.world_size)

    def _empty_forward(self, module: nn.Module) -> th.Tensor:
        """``module`` (the net, through DDP) on zero transitions."""
        net = self._task.net
        obs_space, act_space = net.observation_space, net.action_space
        obs = np.zeros((0, *(obs_space.shape or ())), dtype=obs_space.dtype)
        acts = np.zeros((0, *(act_space.shape or ())), dtype=act_space.dtype)
        dones = np.zeros(0, dtype=bool)
        return module(*net.preprocess(obs, acts, obs, dones))

    def _check_same_rng(self) -> None:
        state = repr(self.rng.bit_generator.state).encode()
        digest = int.from_bytes(hashlib.sha256(state).digest()[:7], "little")
        mine = th.tensor([digest], dtype=th.int64, device=self._comm_device)
        everyone = [th.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(everyone, mine, group=self.process_group)
        differing = [r for r, d in enumerate(everyone) if int(d) != int(everyone[0])]
        if differing:
            raise ValueError(
                "rng must be seeded identically on every process (each draws the "
                f"same batches and computes its share); ranks {differing} differ "
                "from rank 0",
            )

    @property
    def _comm_device(self) -> th.device:
        engine = self.engine
        assert isinstance(engine, DistributedGradientAccumulator)
        return engine._comm_device

    def _train(self, dataset: data_th.Dataset, epoch_multiplier: float = 1.0) -> None:
        self._agree_on_forward_size(dataset)
        super()._train(dataset, epoch_multiplier)

    def _agree_on_forward_size(self, dataset: data_th.Dataset) -> None:
        """Tunes ``forward_size="auto"`` on rank 0 and gives every rank its choice.

        Each rank timing its own calls would choose differently from run to run and
        rank to rank; one choice everywhere keeps a run reproducible from the
        ``forward_size`` that rank 0 logs. Tuned once, on a minibatch of the first
        pairs of the first dataset trained or evaluated on.
        """
        if (
            not self.distributed
            or self.forward_size != "auto"
            or self._agreed_forward_size is not None
        ):
            return
        proposal = (0.0, 0.0)
        if self.rank == 0:
            table = preference_data.read_preferences(dataset)
            share = -(-self.batch_size // self.world_size)
            n_pairs = min(len(table), self.minibatch_size or share)
            self._task.refresh_device()
            chunk = self._task.make_chunk(table, np.arange(n_pairs))
            limit = chunk.layout.n_transitions
            # Time the net alone: DDP's hooks must only see real steps.
            with self._calling_the_net():
                size = super()._tune_forward_size(chunk, limit)
            proposal = (float(size), float(size >= limit))
        engine = self.engine
        assert isinstance(engine, DistributedGradientAccumulator)
        agreed_size, whole = engine.broadcast(proposal)
        self._agreed_forward_size = (int(agreed_size), bool(whole))

    def _tune_forward_size(
        self,
        chunk: preference_task.PairChunk,
        max_size: Optional[int] = None,
    ) -> int:
        if self._agreed_forward_size is None:
            return super()._tune_forward_size(chunk, max_size)
        size, whole_chunks = self._agreed_forward_size
        limit = max_size or chunk.layout.n_transitions
        # Calls as large as allowed when rank 0's tuning found larger calls ever
        # faster (the single-process rule), else rank 0's size; no timing here.
        return limit if whole_chunks else min(size, limit)

    def evaluate(self, dataset: data_th.Dataset) -> accumulation.EvaluationResult:
        """Loss and accuracy of the reward net on ``dataset``, without training.

        Evaluation mode: norm statistics frozen, dropout off. In a process group
        each rank computes its share and the figures are those of the whole
        dataset; every rank must call this.

        Args:
            dataset: Preferences to evaluate on (a ``PreferenceDataset`` or a
                ``Subset`` of one).

        Returns:
            Mean loss, metrics (``accuracy``) and this rank's per-pair losses.
        """
        table = preference_data.read_preferences(dataset)
        self._agree_on_forward_size(dataset)
        self._task.refresh_device()
        chunks = self._make_chunks(table, self._local_items(np.arange(len(table))))
        if chunks:
            self._task.forward_size = self._forward_size_for(chunks[0])
        self._task.two_pass = False
        return self.engine.evaluate(self._task, chunks, n_items=len(table))
