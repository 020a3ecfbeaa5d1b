"""Reward nets in the ``channels_last`` format, and compiled with static shapes.

Both are scoped: a context manager changes the net for the time of a trainer's
training and leaves it as it was, so the net saves and pickles as before (imitation
saves whole reward nets). Neither changes the state dict's values.
"""

import bisect
import contextlib
from typing import Any, Callable, Iterator, List

import torch as th
from imitation.util import networks
from torch import nn

from imitation_accum.engine import checkpointing


def convolution_stacks(net: nn.Module) -> List[nn.Module]:
    """The convolution stacks of imitation's CNN reward nets inside ``net``."""
    return checkpointing.checkpointable_cnns(net)


def check_channels_last(net: nn.Module, name: str) -> None:
    """Checks that ``net`` has a convolution stack to run in ``channels_last``.

    Args:
        net: The reward net.
        name: The option's name, for error messages.

    Raises:
        ValueError: if ``net`` holds no ``CnnRewardNet``/``BasicPotentialCNN``.
    """
    if not convolution_stacks(net):
        raise ValueError(
            f"{name}=True needs a convolutional reward net (a CnnRewardNet or "
            f"BasicPotentialCNN inside it); {type(net).__name__} has none",
        )


def check_compilable(net: nn.Module, name: str) -> None:
    """Checks that ``net`` may be compiled with padded, static-shape calls.

    Args:
        net: The reward net.
        name: The option's name, for error messages.

    Raises:
        ValueError: if ``net`` holds a ``RunningNorm``/``EMANorm`` layer, whose
            statistics the padding rows would enter.
    """
    for module in net.modules():
        if isinstance(module, networks.BaseNorm):
            raise ValueError(
                f"{name}=True: the reward net holds a {type(module).__name__}, whose "
                "statistics the rows that pad ragged calls to a static shape "
                "would enter; train it without compile",
            )


def _to_channels_last(
    module: nn.Module,
    args: Any,
) -> Any:
    x = args[0]
    if isinstance(x, th.Tensor) and x.dim() == 4:
        return (x.contiguous(memory_format=th.channels_last), *args[1:])
    return args


@contextlib.contextmanager
def channels_last(net: nn.Module) -> Iterator[None]:
    """Runs the convolution stacks of ``net`` in the ``channels_last`` format.

    Their 4-d weights are converted in place (the parameters stay the same
    objects, so the optimizer keeps them), and a pre-hook hands each stack its
    input in ``channels_last`` (free for frames that arrive height-width-channels,
    which imitation's ``CnnRewardNet`` permutes into exactly that layout). On exit
    the hooks go and the weights return to the contiguous format.

    Args:
        net: The reward net.

    Yields:
        None.
    """
    stacks = convolution_stacks(net)
    handles = []
    for stack in stacks:
        stack.to(memory_format=th.channels_last)  # type: ignore[call-overload]
        handles.append(stack.register_forward_pre_hook(_to_channels_last))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for stack in stacks:
            stack.to(memory_format=th.contiguous_format)  # type: ignore[call-overload]


def _padded(tensor: Any, rows: int) -> Any:
    if not isinstance(tensor, th.Tensor) or tensor.dim() == 0:
        return tensor
    missing = rows - len(tensor)
    return th.cat([tensor, tensor.new_zeros((missing, *tensor.shape[1:]))])


class StaticShapeForward:
    """Calls a compiled function with row counts it has already seen.

    A call of ``n`` rows runs as the smallest row count seen so far that is at
    least ``n``, padded with zero rows whose outputs are cut off before they are
    returned (so they get no weight in any loss and no gradient flows from them);
    only a call larger than every earlier one brings a new shape. Calls of a step
    come in a few sizes (``forward_size``, then the last, ragged call): the ragged
    call never compiles a shape of its own.

    Args:
        function: The compiled ``forward``; every argument holds one row per
            transition.
    """

    def __init__(self, function: Callable[..., th.Tensor]) -> None:
        self.function = function
        self.sizes: List[int] = []
        """The row counts called so far, in increasing order."""

    def __call__(self, *args: Any) -> th.Tensor:
        """The function's outputs for the rows of ``args`` (padded if need be)."""
        n = len(args[0])
        rows = next((size for size in self.sizes if size >= n), None)
        if rows is None:
            bisect.insort(self.sizes, n)
            rows = n
        if rows == n:
            return self.function(*args)
        return self.function(*(_padded(arg, rows) for arg in args))[:n]


@contextlib.contextmanager
def compiled_forward(net: nn.Module, backend: str = "inductor") -> Iterator[None]:
    """Runs ``net.forward`` through ``torch.compile`` with static shapes.

    The instance's ``forward`` is overridden for the time of the context (calls
    through ``net(...)`` and wrappers such as DDP see it) and restored on exit.

    Args:
        net: The reward net.
        backend: The ``torch.compile`` backend.

    Yields:
        None.
    """
    had_own = "forward" in vars(net)
    original = net.forward
    compiled = th.compile(original, dynamic=False, backend=backend)
    net.forward = StaticShapeForward(compiled)
    try:
        yield
    finally:
        if had_own:
            net.forward = original
        else:
            del net.forward
