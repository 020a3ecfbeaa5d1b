"""The memory estimate against the memory a CPU step measurably takes.

A fresh process trains one step of a small CNN on frames with a budget; the rise
of its peak resident memory (``VmHWM`` after ``clear_refs``, Linux) during
``train`` is compared with the logged estimate of the planned chunk.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

_MEASURE = """
import json, sys
import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.rewards import reward_nets
from imitation_accum import CrossEntropyRewardTrainer

th.set_num_threads(1)
def status(key):
    with open("/proc/self/status") as lines:
        return next(int(l.split()[1]) * 1024 for l in lines if l.startswith(key))
frames = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
net = reward_nets.CnnRewardNet(
    frames, gym.spaces.Discrete(3), hid_channels=(32, 32), use_next_state=False
)
rng = np.random.default_rng(0)
def fragment(length=16):
    return types.TrajectoryWithRew(
        obs=rng.integers(0, 256, (length + 1, *frames.shape), dtype=np.uint8),
        acts=rng.integers(0, 3, length),
        infos=None,
        terminal=False,
        rews=np.zeros(length, np.float32),
    )
data = pc.PreferenceDataset()
data.push([(fragment(), fragment()) for _ in range(8)], np.full(8, 0.5, np.float32))
trainer = CrossEntropyRewardTrainer(
    pc.PreferenceModel(net), pc.CrossEntropyRewardLoss(), np.random.default_rng(0),
    batch_size=8, memory_budget=sys.argv[1], forward_size=32, progress_bar=False,
)
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak resident memory starts again from here
before = status("VmRSS")
trainer.train(data)
logged = trainer.logger.name_to_value
print(json.dumps({
    "measured": status("VmHWM") - before,
    "estimate": logged["reward/final/train/memory_estimate_mib"] * 2**20,
    "reserve": trainer.memory_profile.reserve,
    "chunk": logged["reward/final/train/chunk_transitions"],
}))
"""


def measure(budget: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, budget],
        # Buffers above 64 KiB go straight to and from the OS, so the peak is
        # this step's and not glibc's heap history (which varied it 1.7x).
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not pathlib.Path("/proc/self/clear_refs").exists(),
    reason="needs Linux's peak-RSS reset",
)
def test_cpu_peak_lies_within_the_estimate_and_grows_with_it():
    small, large = measure("400MiB"), measure("1500MiB")
    assert small["chunk"] < large["chunk"]
    for figures in (small, large):
        # The budget holds: what the step took is no more than estimated ...
        assert figures["measured"] <= figures["estimate"]
        # ... and the estimate is not vacuous: activations are most of it.
        assert figures["measured"] >= 0.25 * (figures["estimate"] - figures["reserve"])
    assert large["measured"] > small["measured"] * 1.2
