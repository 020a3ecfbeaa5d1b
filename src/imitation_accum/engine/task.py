"""What a step computes, chunk by chunk: the task protocol and the step's results.

A task is the model-specific half of a step: it runs a chunk through the reward
net (in calls of at most the plan's ``forward_size`` transitions) and computes the
chunk's per-item losses. The engine (:mod:`imitation_accum.engine.accumulator`)
owns everything else. Data flows one way: a task returns what it computes and
never keeps state from one call to the next.
"""

import dataclasses
from typing import (
    Any,
    Dict,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    TypeVar,
)

import numpy as np
import torch as th

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


def concat_losses(parts: Sequence[th.Tensor]) -> np.ndarray:
    """Per-item losses of chunks, in order, as one array."""
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return th.cat(list(parts)).cpu().numpy()
