"""Preference comparisons: pairs of fragments in, an exact reward-net update out."""

from imitation_accum.preference.ensemble import EnsembleTrainer, make_reward_trainer
from imitation_accum.preference.trainer import CrossEntropyRewardTrainer

__all__ = ["CrossEntropyRewardTrainer", "EnsembleTrainer", "make_reward_trainer"]
