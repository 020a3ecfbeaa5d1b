"""The discriminator's half of a step: transitions in, per-transition losses out.

A chunk's loss is the sum of per-transition BCE-with-logits losses (label 1: expert).
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

#: Fields of a transition the discriminator reads.
FIELDS = ("obs", "acts", "next_obs", "dones")


def _count(array: np.ndarray) -> int:
    return 0 if array.ndim == 0 else len(array)


def _numpy(value: Any) -> np.ndarray:
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
        expert: The expert samples' name (for messages) and the samples: a mapping
            with the :data:`FIELDS` (arrays or tensors; other keys are ignored).
        generated: The generator samples' name and the samples, in the same form.
        batch_size: The transitions every field of each must hold.
        obs_shape: The shape of one observation, as the environment emits it.

    Returns:
        The :data:`FIELDS` of each as numpy arrays (views where possible), frames
        in the environment's layout.

    Raises:
        ValueError: if a field is missing, holds another number of transitions, or
            its observations fit the environment's shape in neither layout.
    """
    arrays: List[Tuple[str, Dict[str, np.ndarray]]] = []
    for name, samples in (expert, generated):
        if not isinstance(samples, Mapping):
            raise ValueError(
                f"{name} must be a mapping of transition fields, got "
                f"{type(samples).__name__}",
            )
        missing = [key for key in FIELDS if key not in samples]
        if missing:
            raise ValueError(f"{name} lacks the field(s) {missing}")
        arrays.append((name, {key: _numpy(samples[key]) for key in FIELDS}))
    wrong = [
        f"{name}[{key!r}] holds {_count(array)}"
        for name, fields in arrays
        for key, array in fields.items()
        if _count(array) != batch_size
    ]
    if wrong:
        n_expert, n_gen = (_count(fields["obs"]) for _, fields in arrays)
        # imitation's message first, whole: code that matches on it keeps working.
        raise ValueError(
            "Need to have exactly `demo_batch_size` number of expert and "
            "generator samples, each. "
            f"(n_gen={n_gen} n_expert={n_expert} demo_batch_size={batch_size}): "
            f"{' and '.join(wrong)} transitions",
        )
    for name, fields in arrays:
        for key in ("obs", "next_obs"):
            fields[key] = in_layout(f"{name}[{key!r}]", fields[key], obs_shape)
    return arrays[0][1], arrays[1][1]


def in_layout(
    name: str,
    obs: np.ndarray,
    obs_shape: Tuple[int, ...],
    whose: str = "the environment's",
) -> np.ndarray:
    """``obs`` as is, or a view of it with the channels moved to fit ``obs_shape``.

    Frames recorded behind SB3's ``VecTransposeImage`` (and a CNN policy's input) are
    channels-first; gymnasium's image environments and the replay buffer's are
    channels-last.

    Raises:
        ValueError: naming ``name``, if ``obs`` fits in neither layout.
    """
    moves = ((0, 2, 3, 1), (0, 3, 1, 2)) if obs.ndim == 4 else ()
    for moved in (obs, *(np.transpose(obs, axes) for axes in moves)):
        if tuple(moved.shape[1:]) == tuple(obs_shape):
            return moved
    raise ValueError(
        f"{name} has observations of shape {tuple(obs.shape[1:])}, but "
        f"{whose} are {tuple(obs_shape)} (frames may come channels-first or "
        "channels-last)",
    )


@dataclasses.dataclass
class DiscriminatorChunk:
    """Expert rows of a batch, then the generator ones with the same indices."""

    fields: Dict[str, th.Tensor]
    """The step's staged host tensors: each chunk's expert, then generator rows."""
    start: int
    """Where the chunk begins in ``fields``."""
    stop: int
    labels: th.Tensor
    """1.0 for the expert transitions, then 0.0 for the generator ones."""
    log_policy_act_prob: Optional[th.Tensor] = None
    """The generator policy's log-probabilities of the chunk's actions (AIRL)."""

    def host(self, keys: Sequence[str]) -> List[th.Tensor]:
        """The chunk's ``keys`` fields on the host, expert rows first."""
        return [self.fields[key][self.start : self.stop] for key in keys]


class DiscriminatorTask:
    """Chunks of a discriminator step, their forward and their loss.

    Args:
        logits_fn: The trainer's ``logits_expert_is_high``.
        preprocessing_net: The reward net whose ``preprocess`` prepares the inputs.
        forward_net: The net ``logits_fn`` calls, if not ``preprocessing_net``;
            next observations it ignores are not staged (see ``InputPreparer``).
        stager: Moves each chunk's inputs to the device a chunk ahead, if given.
        pin_memory: Stage into page-locked memory (asynchronous copies to CUDA).
    """

    metric_names = ()

    def __init__(
        self,
        logits_fn: Callable[..., th.Tensor],
        preprocessing_net: reward_nets.RewardNet,
        forward_net: Optional[nn.Module] = None,
        *,
        stager: Optional[staging.Stager[DiscriminatorChunk]] = None,
        pin_memory: bool = False,
    ) -> None:
        self.logits_fn = logits_fn
        self.device = preprocessing_net.device
        self.prepare = input_preparation.InputPreparer(preprocessing_net, forward_net)
        self.keys = (
            FIELDS if self.prepare.reads_next_state else ("obs", "acts", "dones")
        )
        self.stager = stager
        self.pin_memory = pin_memory

    def chunks(
        self,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
        rows: Sequence[slice],
        log_probs: Optional[Sequence[th.Tensor]] = None,
    ) -> List[DiscriminatorChunk]:
        """One chunk per slice of ``rows`` (of both ``expert`` and ``generated``).

        The chunks are staged in that order, in one host copy. ``log_probs``: per
        slice, the generator policy's log-probabilities of its expert actions, then
        of its generator ones (AIRL reads them; ``None`` for GAIL).
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
        for k, r in enumerate(rows):
            n = r.stop - r.start
            labels = (th.arange(2 * n, device=self.device) < n).float()
            chunk = DiscriminatorChunk(fields, offset, offset + 2 * n, labels)
            chunk.log_policy_act_prob = None if log_probs is None else log_probs[k]
            chunks.append(chunk)
            offset += 2 * n
        if self.stager is not None:
            self.stager.schedule(chunks, lambda c: c.host(self.keys), self.device)
        return chunks

    def forward(self, chunk: DiscriminatorChunk) -> th.Tensor:
        """One logit per transition of ``chunk``, expert rows first, in one call.

        Raises:
            ValueError: if the discriminator returns another shape.
        """
        if self.stager is None:
            raw = [t.to(self.device, non_blocking=True) for t in chunk.host(self.keys)]
        else:
            raw = cast(List[th.Tensor], self.stager.fetch(chunk))
        next_obs = raw.pop(2) if self.prepare.reads_next_state else None
        state, action, next_state, done = self.prepare(raw[0], raw[1], next_obs, raw[2])
        logits = self.logits_fn(
            state, action, next_state, done, chunk.log_policy_act_prob
        )
        n = chunk.stop - chunk.start
        if logits.shape != (n,):
            raise ValueError(
                f"discriminator returned logits of shape {tuple(logits.shape)} for "
                f"{n} transitions; expected ({n},)",
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
