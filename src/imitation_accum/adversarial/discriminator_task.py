"""The adversarial half of a step: transitions in, per-transition losses out.

One discriminator step sees ``demo_batch_size`` expert transitions and as many
generator transitions. The batch is cut into chunks: a chunk holds expert
transitions ``[start, stop)`` and the generator transitions with the same indices,
expert first, so that uneven chunks keep both classes balanced. A chunk's forward is
one call of the trainer's ``logits_expert_is_high`` on its transitions; its loss is
the sum of the per-transition binary cross-entropies with logits (label 1 for the
expert), which the engine divides by the transitions in the batch.

Samples are checked (:func:`step_arrays`) and staged once per step in chunk
order (:func:`stage_batch`), so that each chunk is one contiguous slice on its way
to the device.

The statistics imitation reports after a discriminator step are computed by
imitation's own ``compute_train_stats`` over the logits of every transition of the
batch, so that they describe the whole batch whatever the split.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch as th
from imitation.algorithms.adversarial import common
from imitation.rewards import reward_nets
from torch import nn
from torch.nn import functional as F  # noqa: N812

from imitation_accum.engine import staging
from imitation_accum.engine.accumulator import ChunkLoss
from imitation_accum.nets import input_preparation

#: ``logits_expert_is_high(state, action, next_state, done, log_policy_act_prob)``.
LogitsFn = Callable[
    [th.Tensor, th.Tensor, th.Tensor, th.Tensor, Optional[th.Tensor]],
    th.Tensor,
]

#: Fields of a transition the discriminator reads.
FIELDS = ("obs", "acts", "next_obs", "dones")


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, th.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def step_arrays(
    expert: Tuple[str, Mapping[str, Any]],
    generated: Tuple[str, Mapping[str, Any]],
    *,
    batch_size: int,
    obs_shape: Tuple[int, ...],
) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """One step's expert and generator fields the discriminator reads, checked.

    Args:
        expert: The expert samples' name (for error messages) and the samples: a
            mapping with ``obs``, ``acts``, ``next_obs`` and ``dones`` (arrays or
            tensors; other keys are ignored).
        generated: The generator samples' name and the samples, in the same form.
        batch_size: The transitions every field of each must hold.
        obs_shape: The shape of one observation, as the environment emits it.

    Returns:
        The four fields of the expert and of the generator samples as numpy arrays
        (views where possible), frames in the environment's layout.

    Raises:
        ValueError: if a field is missing, holds another number of transitions, or
            its observations fit the environment's shape in neither layout.
    """
    expert_name, gen_name = expert[0], generated[0]
    expert_arrays, gen_arrays = _field_arrays(*expert), _field_arrays(*generated)
    n_expert, n_gen = _count(expert_arrays["obs"]), _count(gen_arrays["obs"])
    if not n_gen == n_expert == batch_size:
        wrong = [
            f"{name}['obs'] holds {n}"
            for name, n in ((expert_name, n_expert), (gen_name, n_gen))
            if n != batch_size
        ]
        # imitation's message first, whole: code that matches on it keeps working.
        raise ValueError(
            "Need to have exactly `demo_batch_size` number of expert and "
            "generator samples, each. "
            f"(n_gen={n_gen} n_expert={n_expert} demo_batch_size={batch_size}): "
            f"{' and '.join(wrong)} transitions",
        )
    return (
        _checked(expert_name, expert_arrays, batch_size, obs_shape),
        _checked(gen_name, gen_arrays, batch_size, obs_shape),
    )


def _count(array: np.ndarray) -> int:
    return 0 if array.ndim == 0 else len(array)


def _field_arrays(name: str, samples: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    if not isinstance(samples, Mapping):
        raise ValueError(
            f"{name} must be a mapping of transition fields, got "
            f"{type(samples).__name__}",
        )
    missing = [key for key in FIELDS if key not in samples]
    if missing:
        raise ValueError(f"{name} lacks the field(s) {missing}")
    return {key: _as_array(samples[key]) for key in FIELDS}


def _checked(
    name: str,
    arrays: Dict[str, np.ndarray],
    batch_size: int,
    obs_shape: Tuple[int, ...],
) -> Dict[str, np.ndarray]:
    for key, array in arrays.items():
        if _count(array) != batch_size:
            raise ValueError(
                "Need to have exactly `demo_batch_size` number of expert and "
                f"generator samples, each. {name}[{key!r}] holds {_count(array)} "
                f"transitions; demo_batch_size={batch_size} needs exactly "
                f"{batch_size} expert and as many generator transitions per "
                "discriminator step",
            )
    for key in ("obs", "next_obs"):
        arrays[key] = in_env_layout(arrays[key], obs_shape)
        if tuple(arrays[key].shape[1:]) != tuple(obs_shape):
            raise ValueError(
                f"{name}[{key!r}] has observations of shape "
                f"{tuple(arrays[key].shape[1:])}, but the environment's are "
                f"{tuple(obs_shape)} (frames may come channels-first or "
                "channels-last)",
            )
    return arrays


def in_env_layout(obs: np.ndarray, obs_shape: Tuple[int, ...]) -> np.ndarray:
    """Frames brought to the environment's channel layout.

    Frames recorded behind SB3's ``VecTransposeImage`` (what an SB3 CNN policy
    reads) are channels-first, while gymnasium's image environments and the
    generator replay buffer are channels-last; frames in the other layout are
    transposed, as a view.

    Args:
        obs: A batch of observations.
        obs_shape: The environment's observation shape.

    Returns:
        ``obs``, with its channels moved if that makes it fit ``obs_shape``.
    """
    if tuple(obs.shape[1:]) == tuple(obs_shape) or obs.ndim != 4:
        return obs
    for axes in ((0, 2, 3, 1), (0, 3, 1, 2)):
        moved = np.transpose(obs, axes)
        if tuple(moved.shape[1:]) == tuple(obs_shape):
            return moved
    return obs


def _torch_dtype(dtype: np.dtype) -> th.dtype:
    return th.from_numpy(np.empty(0, dtype=dtype)).dtype


@dataclasses.dataclass
class StagedBatch:
    """One step's expert and generator transitions, laid out chunk by chunk.

    Per field, one host tensor holds each chunk's expert rows followed by its
    generator rows, chunk after chunk, so that a chunk is one contiguous slice
    that moves to the device on its own (asynchronously, from page-locked memory,
    on CUDA). Frames stay ``uint8`` until the reward net's ``preprocess``.
    """

    fields: Dict[str, th.Tensor]


def stage_batch(
    expert: Mapping[str, np.ndarray],
    generated: Mapping[str, np.ndarray],
    rows: Sequence[slice],
    *,
    keys: Sequence[str] = FIELDS,
    pin_memory: bool = False,
) -> StagedBatch:
    """Lays out expert and generator transitions chunk by chunk (one host copy).

    Args:
        expert: Expert transitions, per field.
        generated: As many generator transitions, per field.
        rows: The rows of each chunk (in both sample sets), covering them in order.
        keys: The fields to stage.
        pin_memory: Stage into page-locked memory (for asynchronous copies to CUDA).

    Returns:
        The staged batch.
    """
    fields = {}
    for key in keys:
        a, b = np.asarray(expert[key]), np.asarray(generated[key])
        dtype = np.result_type(a.dtype, b.dtype)
        staged = th.empty(
            (len(a) + len(b), *a.shape[1:]),
            dtype=_torch_dtype(dtype),
            pin_memory=pin_memory,
        )
        parts = [part for r in rows for part in (a[r], b[r])]
        np.concatenate(parts, out=staged.numpy())
        fields[key] = staged
    return StagedBatch(fields)


@dataclasses.dataclass
class DiscriminatorChunk:
    """Expert transitions ``rows`` of a batch and the generator ones of ``rows``."""

    batch: StagedBatch
    start: int
    """Where the chunk begins in the staged layout."""
    stop: int
    labels: th.Tensor
    """1.0 for the expert transitions, then 0.0 for the generator ones."""
    log_policy_act_prob: Optional[th.Tensor] = None
    """The generator policy's log-probabilities of the chunk's actions (AIRL)."""

    @property
    def n_transitions(self) -> int:
        """Transitions in the chunk, expert and generator together."""
        return self.stop - self.start

    def raw(self, device: th.device, keys: Sequence[str]) -> List[th.Tensor]:
        """The chunk's ``keys`` fields on ``device``, expert rows first."""
        return [
            self.batch.fields[key][self.start : self.stop].to(device, non_blocking=True)
            for key in keys
        ]


#: The generator policy's log-probabilities of a chunk's actions, or ``None``.
LogProbs = Callable[[DiscriminatorChunk], Optional[th.Tensor]]


def make_chunks(
    batch: StagedBatch,
    rows: Sequence[slice],
    device: th.device,
    log_probs: Optional[LogProbs] = None,
) -> List[DiscriminatorChunk]:
    """The chunks of a batch staged with :func:`stage_batch` and the same ``rows``.

    Args:
        batch: The staged batch.
        rows: The rows of each chunk, as staged.
        device: Where the labels go (the reward net's device).
        log_probs: Computes each chunk's ``log_policy_act_prob`` from its
            transitions (AIRL); ``None`` leaves them ``None`` (GAIL).

    Returns:
        One chunk per entry of ``rows``.
    """
    chunks, offset = [], 0
    for r in rows:
        n = r.stop - r.start
        labels = th.cat([th.ones(n, device=device), th.zeros(n, device=device)])
        chunk = DiscriminatorChunk(batch, offset, offset + 2 * n, labels)
        if log_probs is not None:
            chunk = dataclasses.replace(chunk, log_policy_act_prob=log_probs(chunk))
        chunks.append(chunk)
        offset += 2 * n
    return chunks


class DiscriminatorTask:
    """Forward and loss of discriminator chunks.

    Each chunk's loss returns its detached logits (``item_outputs``), from which
    :func:`batch_statistics` computes imitation's statistics once per step.

    Args:
        logits_fn: The trainer's ``logits_expert_is_high``.
        preprocessing_net: The reward net whose ``preprocess`` prepares the inputs.
        forward_net: The net ``logits_fn`` calls, if not ``preprocessing_net``;
            when it ignores ``next_state``, next observations are neither staged,
            moved nor converted (see :mod:`imitation_accum.nets.input_preparation`).
    """

    metric_names = ()

    def __init__(
        self,
        logits_fn: LogitsFn,
        preprocessing_net: reward_nets.RewardNet,
        forward_net: Optional[nn.Module] = None,
    ) -> None:
        self.logits_fn = logits_fn
        self.device = preprocessing_net.device
        self.prepare = input_preparation.InputPreparer(preprocessing_net, forward_net)
        self.stager: Optional[staging.Stager[DiscriminatorChunk]] = None

    def stage(self, chunks: Sequence[DiscriminatorChunk]) -> None:
        """Has the stager, if any, move each chunk's inputs a chunk ahead."""
        if self.stager is not None:
            keys = self.staged_keys

            def host_arrays(chunk: DiscriminatorChunk) -> List[th.Tensor]:
                return [chunk.batch.fields[k][chunk.start : chunk.stop] for k in keys]

            self.stager.schedule(chunks, host_arrays, self.device)

    def inputs(
        self, chunk: DiscriminatorChunk
    ) -> Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """The reward net's preprocessed inputs for the chunk's transitions."""
        if self.prepare.reads_next_state:
            obs, acts, next_obs, dones = self._raw(chunk)
            return self.prepare(obs, acts, next_obs, dones)
        obs, acts, dones = self._raw(chunk)
        return self.prepare(obs, acts, None, dones)

    def _raw(self, chunk: DiscriminatorChunk) -> List[th.Tensor]:
        if self.stager is None:
            return chunk.raw(self.device, self.staged_keys)
        return self.stager.fetch(chunk)  # type: ignore[return-value]

    @property
    def staged_keys(self) -> Tuple[str, ...]:
        """The fields the task reads."""
        if self.prepare.reads_next_state:
            return FIELDS
        return ("obs", "acts", "dones")

    def forward(self, chunk: DiscriminatorChunk, forward_size: int) -> th.Tensor:
        """One call of the discriminator on the chunk's transitions.

        Args:
            chunk: The chunk.
            forward_size: Unused: a chunk is one call (the planner plans so).

        Returns:
            One logit per transition, expert rows first.
        """
        del forward_size
        state, action, next_state, done = self.inputs(chunk)
        logits = self.logits_fn(
            state,
            action,
            next_state,
            done,
            chunk.log_policy_act_prob,
        )
        if logits.shape != (chunk.n_transitions,):
            raise ValueError(
                f"discriminator returned logits of shape {tuple(logits.shape)} for "
                f"{chunk.n_transitions} transitions; expected "
                f"({chunk.n_transitions},)",
            )
        return logits

    def loss(self, chunk: DiscriminatorChunk, outputs: th.Tensor) -> ChunkLoss:
        """Per-transition BCE-with-logits losses; the logits come back with them."""
        losses = F.binary_cross_entropy_with_logits(
            outputs,
            chunk.labels,
            reduction="none",
        )
        # Statistics are computed once per step from the logits (see
        # batch_statistics), not per minibatch: fewer small operations.
        return ChunkLoss(
            loss_sum=losses.sum(),
            item_losses=losses.detach(),
            metric_sums={},
            item_outputs=outputs.detach(),
        )


def batch_statistics(
    logits: th.Tensor,
    labels: th.Tensor,
    mean_loss: float,
) -> Mapping[str, float]:
    """The discriminator statistics imitation reports, over the whole batch.

    imitation's own ``compute_train_stats`` on the whole batch's logits (imitation
    1.0.1 passes it the last minibatch only, with a scaled-down loss).

    Args:
        logits: The logits of every transition of the batch, in chunk order.
        labels: Their labels (1.0 for the expert).
        mean_loss: The batch's mean loss.

    Returns:
        ``disc_loss``, ``disc_acc``, ``disc_acc_expert``, ``disc_acc_gen``,
        ``disc_entropy``, ``disc_proportion_expert_true``,
        ``disc_proportion_expert_pred``, ``n_expert``, ``n_generated``.
    """
    return common.compute_train_stats(
        logits,
        labels.long(),
        th.tensor(mean_loss),
    )
