"""``train_reward_model`` in which one rank fails mid-run (for the tests).

Run with ``torchrun ... failing_rank.py with ...``; the rank ``FAIL_RANK`` raises at
its training step number ``FAIL_AT_STEP`` (counted from 1, over the whole run).
"""

import os

from imitation_accum import preference
from imitation_accum.scripts import train_reward_model

_original_step = preference.CrossEntropyRewardTrainer._train_step
_steps = [0]


def _failing_step(self, table, batch):
    _steps[0] += 1
    failing = int(os.environ.get("RANK", "0")) == int(os.environ["FAIL_RANK"])
    if failing and _steps[0] == int(os.environ["FAIL_AT_STEP"]):
        raise RuntimeError("injected failure")
    return _original_step(self, table, batch)


if __name__ == "__main__":
    preference.CrossEntropyRewardTrainer._train_step = _failing_step
    train_reward_model.main_console()
