"""``train_reward_model`` in which one rank misbehaves (for the tests).

Run with ``torchrun ... failing_rank.py with ...``. The rank ``FAIL_RANK``, at its
training step number ``FAIL_AT_STEP`` (counted from 1, over the whole run),
raises, or with ``FAIL_MODE=hang`` stops responding. With ``OTHER_DATASET`` set,
that rank loads this dataset instead of the one given.
"""

import os
import sys
import time

from imitation_accum import preference
from imitation_accum.scripts import train_reward_model

_original_step = preference.CrossEntropyRewardTrainer._train_step
_steps = [0]


def _is_failing_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == int(os.environ["FAIL_RANK"])


def _failing_step(self, table, batch):
    _steps[0] += 1
    at_step = _steps[0] == int(os.environ.get("FAIL_AT_STEP", "0"))
    if _is_failing_rank() and at_step:
        if os.environ.get("FAIL_MODE") == "hang":
            time.sleep(3600)
        raise RuntimeError("injected failure")
    return _original_step(self, table, batch)


if __name__ == "__main__":
    preference.CrossEntropyRewardTrainer._train_step = _failing_step
    other = os.environ.get("OTHER_DATASET")
    if other and _is_failing_rank():
        sys.argv = [
            f"dataset_path={other}" if arg.startswith("dataset_path=") else arg
            for arg in sys.argv
        ]
    train_reward_model.main_console()
