"""Exact, fast gradient accumulation for imitation's reward-model trainers.

Any ``minibatch_size`` gives the full-batch update: see ``CrossEntropyRewardTrainer``
for preference comparisons.
"""

from imitation_accum.accumulation import GradientAccumulator
from imitation_accum.preference import (
    CrossEntropyRewardTrainer,
    EnsembleTrainer,
    make_reward_trainer,
)

__version__ = "0.1.0"

__all__ = [
    "CrossEntropyRewardTrainer",
    "EnsembleTrainer",
    "GradientAccumulator",
    "make_reward_trainer",
]
