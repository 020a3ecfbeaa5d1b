"""The torch RNG states a step consumes (dropout), saved and restored."""

import contextlib

import torch as th


class RngState:
    """The CPU and (on CUDA) device RNG states, for rewinding.

    Args:
        device: The device whose generator dropout draws from.
    """

    def __init__(self, device: th.device) -> None:
        self.cpu = th.get_rng_state()
        self.cuda = th.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.device = device

    def restore(self) -> None:
        """Puts the generators back where they were when this was taken."""
        th.set_rng_state(self.cpu)
        if self.cuda is not None:
            th.cuda.set_rng_state(self.cuda, self.device)


def forked_rng(device: th.device) -> contextlib.AbstractContextManager:
    """Runs a block with the torch RNG of ``device`` restored afterwards."""
    devices = [device.index or 0] if device.type == "cuda" else []
    return th.random.fork_rng(devices=devices)
