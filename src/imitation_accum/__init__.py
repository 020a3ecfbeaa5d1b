"""Exact, fast gradient accumulation for imitation's reward-model trainers.

Any ``minibatch_size`` gives the full-batch update: see ``CrossEntropyRewardTrainer``
for preference comparisons.
"""

import warnings

with warnings.catch_warnings():
    # sacred 0.8 imports pkg_resources, which setuptools deprecates; nothing a
    # user of this package can act on. Only this first import is quieted.
    warnings.filterwarnings("ignore", "pkg_resources is deprecated", UserWarning)
    import sacred  # noqa: F401

from imitation_accum.adversarial import AIRL, GAIL
from imitation_accum.distributed.trainer import DistributedRewardTrainer
from imitation_accum.engine.acceleration import Acceleration
from imitation_accum.engine.accumulator import GradientAccumulator
from imitation_accum.integrations.patching import patch, patched, unpatch
from imitation_accum.io.safe_loading import load_reward_net, save_reward_net
from imitation_accum.preference import (
    CrossEntropyRewardTrainer,
    EnsembleTrainer,
    make_reward_trainer,
)
from imitation_accum.preference.dataset import PreferenceDataset

__version__ = "0.1.0"

__all__ = [
    "AIRL",
    "GAIL",
    "Acceleration",
    "CrossEntropyRewardTrainer",
    "DistributedRewardTrainer",
    "EnsembleTrainer",
    "GradientAccumulator",
    "PreferenceDataset",
    "load_reward_net",
    "make_reward_trainer",
    "patch",
    "patched",
    "save_reward_net",
    "unpatch",
]
