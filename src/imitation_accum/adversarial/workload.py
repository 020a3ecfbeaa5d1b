"""What the planner may run on discriminator samples: calls on a step's rows."""

import dataclasses
from typing import Callable, Hashable, List, Mapping, Optional, Tuple

import numpy as np
import torch as th

from imitation_accum.adversarial import discriminator_task
from imitation_accum.engine.accumulator import GradientAccumulator
from imitation_accum.planning.workload import NetCall

LogProbs = Callable[[discriminator_task.DiscriminatorChunk], Optional[th.Tensor]]


@dataclasses.dataclass
class DiscriminatorWorkload:
    """Discriminator calls on rows of one step's expert and generator samples.

    A row is an expert transition and the generator transition of the same index;
    ``call(start, stop)`` runs rows ``[start, stop)``.
    """

    task: discriminator_task.DiscriminatorTask
    expert: Mapping[str, np.ndarray]
    generated: Mapping[str, np.ndarray]
    log_probs: Optional[LogProbs]
    """The generator policy's log-probabilities of a chunk (AIRL), or ``None``."""
    engine: GradientAccumulator
    key: Hashable = None
    """Nothing is tuned: a discriminator chunk is one call."""

    @property
    def device(self) -> th.device:
        """The discriminator's device."""
        return self.task.device

    @property
    def params(self) -> List[th.Tensor]:
        """The discriminator's parameters."""
        return list(self.engine.net.parameters())

    def sample(self, n_transitions: int) -> Tuple[NetCall, int]:
        """Calls on the step's rows (all of them are available)."""
        del n_transitions

        def call(start: int, stop: int) -> th.Tensor:
            rows = [slice(0, stop - start)]
            staged = discriminator_task.stage_batch(
                {key: value[start:stop] for key, value in self.expert.items()},
                {key: value[start:stop] for key, value in self.generated.items()},
                rows,
                keys=self.task.staged_keys,
            )
            (chunk,) = discriminator_task.make_chunks(staged, rows, self.device)
            if self.log_probs is not None:
                chunk.log_policy_act_prob = self.log_probs(chunk)
            return self.task.forward(chunk, stop - start)

        return call, len(self.expert["obs"])

    def measuring(self, *, checkpointing: bool = True):
        """The engine's measuring context (see ``GradientAccumulator.measuring``)."""
        return self.engine.measuring(checkpointing=checkpointing)
