"""Reads glibc's trim threshold from what ``free`` does, in a process of its own.

Run as ``python -m tests.host_memory_probe`` from the repository root; prints
one JSON object: scenario -> whether freed heap memory stayed in the process
(``True``) or went back to the kernel (``False``), read before, while (inside
the reward net's ``forward``) and after a trainer trains a reward net on the
CPU. Nothing of the package is stubbed: the reading is glibc's own accounting
(``mallinfo2().keepcost``, the free space at the top of the heap).
"""

import ctypes
import json
import os

import numpy as np
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet
from imitation.util import logger as imit_logger

from imitation_accum import Acceleration
from imitation_accum.engine import host_memory
from tests import reference as ref
from tests.test_preference_exactness import make_trainer

#: Blocks below every mmap threshold glibc uses (its dynamic floor is 128 KiB),
#: so they come from the heap; their sum is well above the resting trim
#: threshold (64 MiB) and well below the training one (2 GiB).
BLOCK_BYTES = 100 * 2**10
BLOCKS = 1600
#: Free space left at the top of the heap above this: the heap was not trimmed.
KEPT_BYTES = 100 * 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


_libc = ctypes.CDLL("libc.so.6")
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = (ctypes.c_size_t,)
_libc.free.argtypes = (ctypes.c_void_p,)
_libc.mallinfo2.restype = _MallInfo2


def freed_memory_kept() -> bool:
    """Allocates ~160 MiB of heap blocks, frees them, and reads the heap's top."""
    blocks = [0] * BLOCKS  # allocated first, so that it does not sit on the top
    for i in range(BLOCKS):
        blocks[i] = _libc.malloc(BLOCK_BYTES)
    for block in reversed(blocks):
        _libc.free(block)
    return _libc.mallinfo2().keepcost > KEPT_BYTES


class ProbingNet(BasicRewardNet):
    """Reads :func:`freed_memory_kept` at every forward; may raise after it."""

    def __init__(self):
        super().__init__(ref.OBS_SPACE, ref.ACT_SPACE)
        self.readings = []
        self.fail = False

    def forward(self, *args):
        self.readings.append(freed_memory_kept())
        if self.fail:
            raise RuntimeError("mid-step")
        return super().forward(*args)


def train_readings(reuse: bool = True, fail: bool = False, device: str = "cpu"):
    """(readings inside every forward, reading after ``train()`` returned)."""
    dataset = ref.make_dataset(np.random.default_rng(0), 4, (3, 3))
    net = ProbingNet().to(device)
    net.fail = fail
    trainer = make_trainer(
        net,
        batch_size=4,
        minibatch_size=2,
        custom_logger=imit_logger.configure(format_strs=[]),
        acceleration=Acceleration(reuse_host_memory=reuse),
    )
    try:
        trainer.train(dataset)
    except RuntimeError as error:
        assert str(error) == "mid-step", error
    return net.readings, freed_memory_kept()


def main():
    assert not any(name in os.environ for name in host_memory.TUNING_VARIABLES)
    out = {"before": freed_memory_kept()}
    out["train"], out["after_train"] = train_readings()
    out["train_again"], out["after_train_again"] = train_readings()
    out["train_opted_out"], out["after_train_opted_out"] = train_readings(False)
    out["train_failing"], out["after_train_failing"] = train_readings(fail=True)
    with host_memory.kept_for_reuse() as tuned:
        out["context"] = (tuned, freed_memory_kept())
    out["after_context"] = freed_memory_kept()
    try:
        with host_memory.kept_for_reuse():
            raise KeyError("mid-step")
    except KeyError:
        out["after_context_error"] = freed_memory_kept()
    with host_memory.kept_for_reuse(enabled=False) as tuned:
        out["context_disabled"] = (tuned, freed_memory_kept())
    # The options applied to a net: malloc tuned for a net on the CPU (or one
    # without parameters), left alone for a net elsewhere (here: the meta device).
    for name, module in [
        ("cpu_net", BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE)),
        ("parameterless_net", th.nn.Module()),
        ("meta_net", BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE).to("meta")),
    ]:
        with Acceleration().applied(module):
            out[f"applied_{name}"] = freed_memory_kept()
        with Acceleration(reuse_host_memory=False).applied(module):
            out[f"applied_opted_out_{name}"] = freed_memory_kept()
    if th.cuda.is_available():  # a net off the CPU: malloc left alone
        out["train_on_cuda"] = train_readings(device="cuda")[0]
    # The process's environment tunes malloc: the package leaves it alone.
    for name in host_memory.TUNING_VARIABLES:
        os.environ[name] = "1048576"
        out[f"train_with_{name}"] = train_readings()[0]
        with host_memory.kept_for_reuse() as tuned:
            out[f"context_with_{name}"] = (tuned, freed_memory_kept())
        del os.environ[name]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
