"""The discriminator's half of a step: transitions in, per-transition losses out.

A chunk holds expert transitions ``[start, stop)`` of the batch and the generator
transitions with the same indices, expert first, staged as one contiguous slice;
its loss is the sum of per-transition BCE-with-logits losses (label 1: expert).
"""

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

import numpy as np
import torch as th
from imitation.rewards import reward_nets
from torch import nn
from torch.nn import functional as F  # noqa: N812

from imitation_accum.engine import staging
from imitation_accum.engine.accumulator import ChunkLoss
from imitation_accum.nets import input_preparation

#: ``logits_expert_is_high(state, action, next_state, done, log_policy_act_prob)``.
LogitsFn = Callable[..., th.Tensor]

#: Fields of a transition the discriminator reads.
FIELDS = ("obs", "acts", "next_obs", "dones")


def _count(array: np.ndarray) -> int:
    return 0 if array.ndim == 0 else len(array)


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
    arrays = []
    for name, samples in (expert, generated):
        if not isinstance(samples, Mapping):
            raise ValueError(
                f"{name} must be a mapping of transition fields, got "
                f"{type(samples).__name__}",
            )
        missing = [key for key in FIELDS if key not in samples]
        if missing:
            raise ValueError(f"{name} lacks the field(s) {missing}")
        arrays.append(
            {
                key: samples[key].detach().cpu().numpy()
                if isinstance(samples[key], th.Tensor)
                else np.asarray(samples[key])
                for key in FIELDS
            }
        )
    names = (expert[0], generated[0])
    wrong = [
        f"{name}[{key!r}] holds {_count(array)}"
        for name, fields in zip(names, arrays)
        for key, array in fields.items()
        if _count(array) != batch_size
    ]
    if wrong:
        n_expert, n_gen = (_count(fields["obs"]) for fields in arrays)
        # imitation's message first, whole: code that matches on it keeps working.
        raise ValueError(
            "Need to have exactly `demo_batch_size` number of expert and "
            "generator samples, each. "
            f"(n_gen={n_gen} n_expert={n_expert} demo_batch_size={batch_size}): "
            f"{' and '.join(wrong)} transitions",
        )
    for name, fields in zip(names, arrays):
        for key in ("obs", "next_obs"):
            fields[key] = _in_env_layout(fields[key], obs_shape)
            if tuple(fields[key].shape[1:]) != tuple(obs_shape):
                raise ValueError(
                    f"{name}[{key!r}] has observations of shape "
                    f"{tuple(fields[key].shape[1:])}, but the environment's are "
                    f"{tuple(obs_shape)} (frames may come channels-first or "
                    "channels-last)",
                )
    return arrays[0], arrays[1]


def _in_env_layout(obs: np.ndarray, obs_shape: Tuple[int, ...]) -> np.ndarray:
    # Frames moved (as a view) to the environment's channel layout if that makes
    # them fit: frames recorded behind SB3's VecTransposeImage are channels-first,
    # gymnasium's image environments and the generator replay buffer channels-last.
    if tuple(obs.shape[1:]) == tuple(obs_shape) or obs.ndim != 4:
        return obs
    for axes in ((0, 2, 3, 1), (0, 3, 1, 2)):
        moved = np.transpose(obs, axes)
        if tuple(moved.shape[1:]) == tuple(obs_shape):
            return moved
    return obs


@dataclasses.dataclass
class DiscriminatorChunk:
    """Expert transitions ``rows`` of a batch and the generator ones of ``rows``."""

    fields: Dict[str, th.Tensor]
    """The step's staged host tensors, per field: each chunk's expert rows, then
    its generator rows, chunk after chunk (frames stay ``uint8``)."""
    start: int
    """Where the chunk begins in ``fields``."""
    stop: int
    labels: th.Tensor
    """1.0 for the expert transitions, then 0.0 for the generator ones."""
    log_policy_act_prob: Optional[th.Tensor] = None
    """The generator policy's log-probabilities of the chunk's actions (AIRL)."""

    @property
    def n_transitions(self) -> int:
        """Transitions in the chunk, expert and generator together."""
        return self.stop - self.start

    def host(self, keys: Sequence[str]) -> List[th.Tensor]:
        """The chunk's ``keys`` fields on the host, expert rows first."""
        return [self.fields[key][self.start : self.stop] for key in keys]

    def raw(self, device: th.device, keys: Sequence[str]) -> List[th.Tensor]:
        """The chunk's ``keys`` fields on ``device``, expert rows first."""
        return [t.to(device, non_blocking=True) for t in self.host(keys)]


class DiscriminatorTask:
    """Chunks of a discriminator step, their forward and their loss.

    A chunk's loss returns its detached logits (``item_outputs``) as well.

    Args:
        logits_fn: The trainer's ``logits_expert_is_high``.
        preprocessing_net: The reward net whose ``preprocess`` prepares the inputs.
        forward_net: The net ``logits_fn`` calls, if not ``preprocessing_net``;
            when it ignores ``next_state``, next observations are neither staged,
            moved nor converted (see :mod:`imitation_accum.nets.input_preparation`).
        log_probs: Computes a chunk's ``log_policy_act_prob`` (AIRL); ``None``
            leaves them ``None`` (GAIL).
        stager: Moves each chunk's inputs to the device a chunk ahead, if given.
        pin_memory: Stage into page-locked memory (asynchronous copies to CUDA).
    """

    metric_names = ()

    def __init__(
        self,
        logits_fn: LogitsFn,
        preprocessing_net: reward_nets.RewardNet,
        forward_net: Optional[nn.Module] = None,
        *,
        log_probs: Optional[Callable[[DiscriminatorChunk], Optional[th.Tensor]]],
        stager: Optional[staging.Stager[DiscriminatorChunk]] = None,
        pin_memory: bool = False,
    ) -> None:
        self.logits_fn = logits_fn
        self.device = preprocessing_net.device
        self.prepare = input_preparation.InputPreparer(preprocessing_net, forward_net)
        self.keys = (
            FIELDS if self.prepare.reads_next_state else ("obs", "acts", "dones")
        )
        self.log_probs = log_probs
        self.stager = stager
        self.pin_memory = pin_memory

    def chunks(
        self,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
        rows: Sequence[slice],
    ) -> List[DiscriminatorChunk]:
        """One chunk per entry of ``rows``, staged in that order (one host copy).

        ``rows`` are the rows of each chunk in both the ``expert`` and the
        ``generated`` transitions (per field), covering them in order.
        """
        fields = {}
        for key in self.keys:
            a, b = np.asarray(expert[key]), np.asarray(generated[key])
            dtype = th.from_numpy(np.empty(0, np.result_type(a.dtype, b.dtype))).dtype
            fields[key] = th.empty(
                (len(a) + len(b), *a.shape[1:]), dtype=dtype, pin_memory=self.pin_memory
            )
            parts = [part for r in rows for part in (a[r], b[r])]
            np.concatenate(parts, out=fields[key].numpy())
        chunks, offset = [], 0
        for r in rows:
            n = r.stop - r.start
            ones, zeros = (
                th.ones(n, device=self.device),
                th.zeros(n, device=self.device),
            )
            labels = th.cat([ones, zeros])
            chunk = DiscriminatorChunk(fields, offset, offset + 2 * n, labels)
            if self.log_probs is not None:
                chunk.log_policy_act_prob = self.log_probs(chunk)
            chunks.append(chunk)
            offset += 2 * n
        if self.stager is not None:
            keys = self.keys
            self.stager.schedule(chunks, lambda c: c.host(keys), self.device)
        return chunks

    def forward(self, chunk: DiscriminatorChunk, forward_size: int) -> th.Tensor:
        """One call of the discriminator on the chunk's transitions.

        Args:
            chunk: The chunk.
            forward_size: Unused: a chunk is one call (the planner plans so).

        Returns:
            One logit per transition, expert rows first.

        Raises:
            ValueError: if the discriminator returns another shape.
        """
        del forward_size
        if self.stager is None:
            raw = chunk.raw(self.device, self.keys)
        else:
            raw = cast(List[th.Tensor], self.stager.fetch(chunk))
        next_obs = raw.pop(2) if self.prepare.reads_next_state else None
        state, action, next_state, done = self.prepare(raw[0], raw[1], next_obs, raw[2])
        logits = self.logits_fn(
            state, action, next_state, done, chunk.log_policy_act_prob
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
            outputs, chunk.labels, reduction="none"
        )
        return ChunkLoss(
            loss_sum=losses.sum(),
            item_losses=losses.detach(),
            metric_sums={},
            item_outputs=outputs.detach(),
        )
