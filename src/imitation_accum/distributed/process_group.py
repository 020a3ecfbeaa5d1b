"""The process group: joining it, this process's place in it, failures."""

import contextlib
import dataclasses
import datetime
import os
import time
from typing import Any, Iterator, List, Mapping, Optional, Union

import numpy as np
import torch as th
import torch.distributed as dist

from imitation_accum import _validation

#: Seconds a collective waits for the other ranks before the job fails (gloo's
#: own default, 30 minutes, leaves a job with a stopped rank hanging that long).
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0

#: Store key by which a rank that timed out says so, to name the ones that did not.
_TIMED_OUT_KEY = "imitation_accum/timed_out/{}"


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
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """How long a collective waits for the other ranks."""

    @property
    def distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that logs and writes files."""
        return self.rank == 0


def launched_by_torchrun(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``environ`` (default ``os.environ``) sets torchrun's four variables."""
    env = os.environ if environ is None else environ
    return all(n in env for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def resolve_device(device: Union[str, th.device], local_rank: int = 0) -> th.device:
    """The device this process trains on.

    Args:
        device: ``"auto"`` (this process's GPU if there is one, else the CPU),
            ``"cuda"`` (this process's GPU), or any explicit device.
        local_rank: The process's index on its machine, which picks its GPU.

    Raises:
        ValueError: if ``device`` names no device, or CUDA is asked for but absent.
    """
    if device == "auto":
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


def check_timeout(name: str, value: object) -> float:
    """A collective timeout if a positive finite number, else ``ValueError``."""
    return _validation.finite_float(name, value)


def init_distributed(
    device: Union[str, th.device] = "auto",
    *,
    backend: Optional[str] = None,
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
) -> DistributedContext:
    """Joins the process group described by the environment, if there is one.

    Under ``torchrun`` this initializes ``torch.distributed`` (see :func:`backend_for`);
    an initialized default group is used as it is; otherwise this is one process.

    Args:
        device: See :func:`resolve_device`.
        backend: Force a backend.
        timeout_s: How long a collective waits for the other ranks before it fails.

    Returns:
        This process's context.
    """
    timeout_s = check_timeout("timeout_s", timeout_s)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank)
    if resolved.type == "cuda":
        th.cuda.set_device(resolved)
    owns = not dist.is_initialized() and launched_by_torchrun()
    if owns:
        dist.init_process_group(
            backend or backend_for(resolved),
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    if not dist.is_initialized():
        return DistributedContext(device=resolved)
    return DistributedContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=resolved,
        backend=str(dist.get_backend()),
        owns_group=owns,
        timeout_s=timeout_s,
    )


def shutdown_distributed(context: DistributedContext) -> None:
    """Leaves the process group, if :func:`init_distributed` created it."""
    if context.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def _is_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    timed_out = "timed out" in text or "timeout" in text
    return timed_out or isinstance(error, dist.DistBackendError)


def _timeout_message(context: DistributedContext) -> str:
    # Names the ranks that did not also time out within a grace period: stopped or
    # stuck. Every rank whose collective times out says so in torchrun's store
    # (which still works); the ranks that waited time out at about the same
    # moment, the one they waited for does not.
    message = f"a collective timed out after {context.timeout_s:g} s"
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(_TIMED_OUT_KEY.format(context.rank), "1")
        deadline = time.monotonic() + min(30.0, max(2.0, context.timeout_s / 10))
        ranks = range(context.world_size)
        while missing := [
            r for r in ranks if not store.check([_TIMED_OUT_KEY.format(r)])
        ]:
            if time.monotonic() >= deadline:
                who = "rank" if len(missing) == 1 else "ranks"
                listed = ", ".join(str(r) for r in missing)
                return f"{message}: {who} {listed} did not reach it (stopped or stuck)"
            time.sleep(0.2)
    except Exception:  # the store is gone too: nothing more to say
        pass
    return message


@contextlib.contextmanager
def reporting_failures(context: DistributedContext) -> Iterator[None]:
    """Re-raises an error of a distributed run with this process's rank in it.

    The error is also recorded for ``torchrun``'s summary; a timed-out collective
    names the ranks that did not reach it. A single process's errors pass as they
    are.

    Raises:
        RankFailedError: from any exception of the block, in a distributed run.
    """
    try:
        yield
    except Exception as error:
        if not context.distributed:
            raise
        detail = f"{type(error).__name__}: {error}"
        if _is_timeout(error):
            detail = f"{_timeout_message(context)} ({detail})"
        failure = RankFailedError(
            f"rank {context.rank} of {context.world_size} failed: {detail}",
        )
        # torchrun prints the error file of the first rank that failed.
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):
            from torch.distributed.elastic.multiprocessing import errors

            errors.ErrorHandler().record_exception(failure)
        raise failure from error


@contextlib.contextmanager
def distributed_session(
    device: Union[str, th.device] = "auto",
    *,
    backend: Optional[str] = None,
    timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
) -> Iterator[DistributedContext]:
    """:func:`init_distributed` (same arguments), :func:`reporting_failures`, exit.

    The group is left only after a successful block: after a failure another rank
    may still wait in a collective, and tearing NCCL down under it can hang.

    Yields:
        This process's context (see ``DistributedRewardTrainer``'s example).
    """
    context = init_distributed(device, backend=backend, timeout_s=timeout_s)
    with reporting_failures(context):
        yield context
    shutdown_distributed(context)


def local_share(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous share of ``indices`` among ``world_size``.

    Shares differ in size by at most one (the first ranks get the extra items); a
    rank gets none when there are fewer items than ranks.
    """
    base, extra = divmod(len(indices), world_size)
    start = rank * base + min(rank, extra)
    return indices[start : start + base + (rank < extra)]


def check_batch_size(name: str, batch_size: int, world_size: int) -> None:
    """Raises ``ValueError`` naming ``name`` if ``batch_size < world_size``."""
    if batch_size < world_size:
        raise ValueError(
            f"{name}={batch_size} is smaller than the number of processes "
            f"({world_size}): every process needs at least one pair of a full "
            "batch. Raise the batch size or start fewer processes.",
        )


def check_same_on_every_rank(
    context: DistributedContext,
    what: str,
    value: str,
    shown: Optional[str] = None,
    advice: str = "",
) -> None:
    """Checks that every rank holds the same ``value`` (such as a data fingerprint).

    Args:
        context: This process's context.
        what: What the value is (``"the data"``), for the message.
        value: This rank's value.
        shown: How the message shows ``value`` (default: itself).
        advice: What to do about a difference, appended to the message.

    Raises:
        ValueError: naming every rank's value, if they differ.
    """
    if not context.distributed:
        return
    gathered: List[Any] = [None] * context.world_size
    dist.all_gather_object(gathered, (value, value if shown is None else shown))
    if len({v for v, _ in gathered}) > 1:
        listed = "; ".join(f"rank {r}: {s}" for r, (_, s) in enumerate(gathered))
        raise ValueError(f"the ranks disagree on {what} ({listed}){advice}")
