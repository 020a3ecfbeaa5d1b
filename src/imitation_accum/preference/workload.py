"""What the planner may run on preference data: reward-net calls on a batch's pairs."""

import dataclasses
from typing import Hashable, List, Tuple

import numpy as np
import torch as th

from imitation_accum.engine.accumulator import GradientAccumulator
from imitation_accum.planning import forward_size
from imitation_accum.planning.workload import NetCall
from imitation_accum.preference import pair_table, pair_task


@dataclasses.dataclass
class PairWorkload:
    """Calls of a preference task on the first pairs of a batch.

    Calls go to the net itself, never through a wrapper such as DDP's: timings
    and probes differentiate with ``torch.autograd.grad``, and DDP must see only
    the real steps' forwards and backwards.
    """

    task: pair_task.PreferenceTask
    table: pair_table.PreferenceTable
    local: np.ndarray
    """The pairs of the batch (this process's share), in order."""
    engine: GradientAccumulator
    key: Hashable

    @classmethod
    def of(
        cls,
        task: pair_task.PreferenceTask,
        table: pair_table.PreferenceTable,
        local: np.ndarray,
        engine: GradientAccumulator,
    ) -> "PairWorkload":
        """The workload of pairs ``local``; its key names what timings depend on."""
        frame: np.ndarray = np.asarray(table.pairs[0][0].obs)
        extra: Tuple[Hashable, ...] = (
            tuple(frame.shape[1:]),
            str(frame.dtype),
            str(task.device),
            engine.autocast_dtype,
            bool(engine.checkpointed),
        )
        # Built once per net and input: a step should not walk the parameters.
        cached = task.workload_keys.get(extra)
        if cached is None:
            cached = forward_size.architecture_key(task.net, *extra)
            task.workload_keys[extra] = cached
        return cls(task, table, local, engine, cached)

    @property
    def epoch_transitions(self) -> int:
        """Transitions of one epoch over the dataset (bounds the tuning's cost)."""
        return int(self.table.lengths.sum())

    @property
    def device(self) -> th.device:
        """The net's device."""
        return self.task.device

    @property
    def params(self) -> List[th.Tensor]:
        """The net's parameters."""
        return list(self.task.net.parameters())

    def sample(self, n_transitions: int) -> Tuple[NetCall, int]:
        """Calls over the first pairs of the batch holding ``n_transitions``."""
        lengths = np.cumsum(self.table.lengths[self.local].sum(1))
        n_pairs = int(np.searchsorted(lengths, n_transitions)) + 1
        pairs = self.local[: min(len(lengths), n_pairs)]
        layout = self.table.layout(pairs)
        net = self.task.net
        if self.task.stager is None and self.task.staged.applies(self.table, pairs):
            # As the steps' calls do: slices of inputs converted beforehand.
            inputs = self.task.convert(layout, 0, layout.n_transitions)

            def sliced(start: int, stop: int) -> th.Tensor:
                part = tuple(tensor[start:stop] for tensor in inputs)
                return self.task.run(part, start, stop, module=net)  # type: ignore[arg-type]

            return sliced, layout.n_transitions

        def call(start: int, stop: int) -> th.Tensor:
            return self.task.call(layout, start, stop, module=net)

        return call, layout.n_transitions

    def measuring(self, *, checkpointing: bool = True):
        """The engine's measuring context (see ``GradientAccumulator.measuring``)."""
        return self.engine.measuring(checkpointing=checkpointing)
