"""Activation checkpointing of the CNN stacks of imitation's reward nets."""

import contextlib
from typing import (
    Callable,
    Iterator,
    List,
    Sequence,
)

import torch as th
from imitation.rewards import reward_nets
from imitation.util import networks
from torch import nn
from torch.utils import checkpoint as torch_checkpoint


def checkpointable_cnns(net: nn.Module) -> List[nn.Module]:
    """The convolution stacks of imitation's CNN reward nets inside ``net``.

    Args:
        net: A reward net, possibly wrapped (normalized, shaped, ensembles).

    Returns:
        The ``cnn`` of every ``CnnRewardNet`` and the potential net of every
        ``BasicPotentialCNN`` in ``net``.
    """
    stacks: List[nn.Module] = []
    for module in net.modules():
        if isinstance(module, reward_nets.CnnRewardNet):
            stacks.append(module.cnn)
        elif isinstance(module, reward_nets.BasicPotentialCNN):
            stacks.append(module._potential_net)
    return stacks


def check_checkpointable(
    net: nn.Module,
    name: str = "activation_checkpointing",
) -> None:
    """Checks that ``net`` has a CNN stack to checkpoint, free of norm layers.

    Args:
        net: The reward net.
        name: The argument's name, for error messages.

    Raises:
        ValueError: if ``net`` holds no ``CnnRewardNet``/``BasicPotentialCNN``, or a
            stack holds a stateful norm layer (recomputation would update it twice).
    """
    stacks = checkpointable_cnns(net)
    if not stacks:
        raise ValueError(
            f"{name}=True needs a CnnRewardNet (or BasicPotentialCNN) in the reward "
            f"net; {type(net).__name__} has none",
        )
    for stack in stacks:
        for module in stack.modules():
            if isinstance(module, networks.BaseNorm):
                raise ValueError(
                    f"{name}=True: the CNN holds a {type(module).__name__}, whose "
                    "statistics a recomputation would update twice",
                )


@contextlib.contextmanager
def checkpointing(stacks: Sequence[nn.Module]) -> Iterator[None]:
    """Runs each stack under non-reentrant activation checkpointing.

    Within the context, a stack called with gradient enabled keeps only its input
    for the backward and recomputes its activations there (same dropout masks:
    the RNG state is replayed). The modules themselves are not changed: their
    ``forward`` is overridden on the instance and restored on exit, so state
    dicts and pickles are unaffected.

    Args:
        stacks: Modules to checkpoint (:func:`checkpointable_cnns`).

    Yields:
        None.
    """
    stacks = list({id(stack): stack for stack in stacks}.values())
    for stack in stacks:
        original = stack.forward

        def forward(
            x: th.Tensor,
            _original: Callable[[th.Tensor], th.Tensor] = original,
        ) -> th.Tensor:
            if not th.is_grad_enabled():
                return _original(x)
            return torch_checkpoint.checkpoint(_original, x, use_reentrant=False)

        stack.forward = forward
    try:
        yield
    finally:
        for stack in stacks:
            del stack.forward
