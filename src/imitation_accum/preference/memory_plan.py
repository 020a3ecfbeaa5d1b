"""A preference trainer's memory budget: the probe and the chunk cap it gives."""

from typing import TYPE_CHECKING

import numpy as np

from imitation_accum.planning import budget, probe
from imitation_accum.preference import pair_table
from imitation_accum.preference.workload import PairWorkload

if TYPE_CHECKING:
    from imitation_accum.preference.trainer import CrossEntropyRewardTrainer


def probe_first_pair(
    trainer: "CrossEntropyRewardTrainer",
    table: pair_table.PreferenceTable,
) -> probe.ActivationProfile:
    """Counts what a few reward-net calls on the first pair keep for backward.

    Args:
        trainer: The trainer whose net and optimizer are probed.
        table: The dataset.

    Returns:
        The profile.
    """
    frame = np.asarray(table.pairs[0][0].obs)
    return probe.profile_workload(
        PairWorkload.of(trainer._task, table, np.arange(1), trainer.engine),
        sample_transitions=1,
        fixed_bytes=budget.training_state_bytes(trainer.optim),
        # obs and next_obs converted to float32 on the device.
        input_bytes_per_transition=2 * 4 * int(np.prod(frame.shape[1:])),
        checkpointed=trainer.activation_checkpointing,
    )


def fit_budget(
    trainer: "CrossEntropyRewardTrainer",
    table: pair_table.PreferenceTable,
) -> None:
    """Sets the trainer's chunk cap from its ``memory_budget`` and logs it.

    The probe runs once per net architecture, input and device.

    Args:
        trainer: A trainer with a ``memory_budget``.
        table: The dataset (its largest batch bounds the cap).

    Raises:
        ValueError: if not even one transition fits in the budget.
    """
    assert trainer.memory_budget is not None
    planner = trainer.planner
    key = PairWorkload.of(trainer._task, table, np.arange(1), trainer.engine).key
    if planner.profile is None or planner.profile_key != key:
        planner.profile, planner.profile_key = trainer._probe(table), key
    pair_lengths = table.lengths.sum(1)
    largest_batch = int(np.sort(pair_lengths)[-trainer.batch_size :].sum())
    in_bytes = planner.fit_budget(
        trainer.memory_budget,
        planner.profile,
        device=trainer._task.device,
        resident_bytes=budget.resident_training_bytes(trainer.optim),
        largest_batch=largest_batch,
    )
    trainer.logger.log(
        probe.budget_message(
            in_bytes,
            planner.profile,
            cap=planner.chunk_cap or 0,
            item=int(pair_lengths.max()),
            largest_batch=largest_batch,
        ),
    )
