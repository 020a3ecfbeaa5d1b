"""Reward nets saved as imitation saves them (the whole module), and loaded safely.

torch 2.6 and later load with ``weights_only=True``, which refuses imitation's
pickled modules; this package's loads (and imitation's ``load_reward`` while
patched) allow the classes of :func:`default_safe_globals` for that load only,
leaving torch's allow-list as it was. Other classes need :func:`register_safe_classes`.
"""

import contextlib
import copy
import functools
import importlib
import inspect
import pathlib
import pickle
import warnings
from typing import Any, Callable, Iterator, List, Tuple, Union

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms.adversarial import gail
from imitation.rewards import reward_nets
from imitation.util import networks
from torch import nn

from imitation_accum.io.atomic import AnyPath, atomic_save
from imitation_accum.nets import shaped as accum_reward_nets

SafeGlobal = Union[Callable[..., Any], Tuple[Callable[..., Any], str]]

#: Classes registered with :func:`register_safe_classes`.
_registered: List[SafeGlobal] = []


def _numpy_globals() -> List[SafeGlobal]:
    # What gymnasium spaces pickle: arrays, dtypes, scalars and their generators.
    from numpy.random import _pickle as random_pickle
    from numpy.random import bit_generator

    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1.x
        multiarray = importlib.import_module("numpy.core.multiarray")
    found: List[SafeGlobal] = [np.ndarray, np.dtype]
    for name in ("_reconstruct", "scalar"):
        function = getattr(multiarray, name)
        found.append(function)
        # Files written under numpy 1.x name these numpy.core.multiarray.*.
        found.append((function, f"numpy.core.multiarray.{name}"))
    found += [v for v in vars(np.dtypes).values() if inspect.isclass(v)]
    found += [np.random.Generator, bit_generator.SeedSequence]
    found += [np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937]
    found += [np.random.Philox, np.random.SFC64]
    optional = [
        (random_pickle, "__generator_ctor"),
        (random_pickle, "__bit_generator_ctor"),
        (bit_generator, "__pyx_unpickle_SeedSequence"),
    ]
    return found + [
        getattr(module, name) for module, name in optional if hasattr(module, name)
    ]


def default_safe_globals() -> List[SafeGlobal]:
    """The classes and functions a reward net of imitation's kinds pickles.

    Reward nets (imitation's, ours, GAIL's), norm layers, ``torch.nn`` layers,
    gymnasium's array spaces and the numpy types they hold.
    """
    found: List[SafeGlobal] = [gail.RewardNetFromDiscriminatorLogit]
    for module in (reward_nets, accum_reward_nets, networks, nn):
        found += [
            v
            for v in vars(module).values()
            if inspect.isclass(v) and issubclass(v, nn.Module)
        ]
    spaces = gym.spaces
    found += [spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary]
    return found + _numpy_globals()


def register_safe_classes(*classes: SafeGlobal) -> None:
    """Lets this package's loads (and imitation's, while patched) rebuild ``classes``.

    Args:
        *classes: Classes or functions, or ``(object, "module.name")`` pairs.

    Example:
        >>> register_safe_classes(MyRewardNet)  # doctest: +SKIP
    """
    _registered.extend(c for c in classes if c not in _registered)


@functools.cache
def _defaults() -> Tuple[SafeGlobal, ...]:
    return tuple(default_safe_globals())


@contextlib.contextmanager
def allowing_reward_nets() -> Iterator[None]:
    """A block in which ``torch.load(weights_only=True)`` rebuilds reward nets.

    Yields:
        Nothing.
    """
    with th.serialization.safe_globals([*_defaults(), *_registered]):
        yield


def unwrapped(net: nn.Module) -> nn.Module:
    """``net`` without a ``DistributedDataParallel`` (or ``DataParallel``) wrapper."""
    inner = getattr(net, "module", None)
    return inner if isinstance(inner, nn.Module) else net


def save_reward_net(net: nn.Module, path: AnyPath) -> pathlib.Path:
    """Saves a CPU copy of ``net`` (unwrapped from DDP) as imitation does, atomically.

    Returns:
        ``path`` (``.../reward_net.pt`` by imitation's convention) as a ``Path``.

    Raises:
        TypeError: if ``net`` is not an imitation ``RewardNet``.
    """
    net = unwrapped(net)
    if not isinstance(net, reward_nets.RewardNet):
        raise TypeError(f"net must be an imitation RewardNet, got {type(net).__name__}")
    target = atomic_save(copy.deepcopy(net).to("cpu"), path)
    unknown = unsafe_globals(target)
    if unknown:
        warnings.warn(
            f"{target} holds classes that torch.load(weights_only=True) refuses: "
            f"{', '.join(unknown)}. Call imitation_accum.checkpoint."
            "register_safe_classes with them before loading the file.",
            stacklevel=2,
        )
    return target


def unsafe_globals(path: AnyPath) -> List[str]:
    """Qualified names of globals in ``th.save`` file ``path`` that our loads refuse.

    Empty for files torch cannot read.
    """
    with allowing_reward_nets():
        return pickled_globals(path)


def pickled_globals(path: AnyPath) -> List[str]:
    """As :func:`unsafe_globals`, against torch's allow-list as it is now."""
    finder = getattr(th.serialization, "get_unsafe_globals_in_checkpoint", None)
    if finder is None:  # torch < 2.5
        return []
    try:
        return sorted(finder(str(path)))
    except Exception:  # not a torch.save file: nothing to name
        return []


def load_reward_net(
    path: AnyPath,
    *,
    map_location: Union[str, th.device, None] = "cpu",
    weights_only: bool = True,
) -> reward_nets.RewardNet:
    """Loads a reward net saved by imitation or by :func:`save_reward_net`.

    Args:
        path: A file holding a whole reward-net module (imitation's format).
        map_location: Where to put its tensors (default: the CPU).
        weights_only: Rebuild only registered classes; ``False`` runs arbitrary
            code from the file (only for files you trust).

    Returns:
        The reward net, in evaluation mode as imitation's loaders leave it.

    Raises:
        ValueError: if ``path`` does not exist, cannot be read or holds classes
            that are not registered (named in the message).
        TypeError: if the file holds something other than a ``RewardNet``.
    """
    source = pathlib.Path(path)
    if not source.is_file():
        raise ValueError(f"reward net file {str(source)!r} does not exist")
    try:
        with allowing_reward_nets():
            net = th.load(source, map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as error:
        unknown = unsafe_globals(source)
        detail = f" It holds unregistered classes: {', '.join(unknown)}." * bool(
            unknown
        )
        raise ValueError(
            f"cannot load the reward net in {str(source)!r} with "
            f"weights_only={weights_only}.{detail} Register its classes with "
            "imitation_accum.checkpoint.register_safe_classes, or pass "
            "weights_only=False if you trust the file."
        ) from error
    except Exception as error:
        raise ValueError(
            f"cannot read the reward net in {str(source)!r}: "
            f"{type(error).__name__}: {error}"
        ) from error
    if not isinstance(net, reward_nets.RewardNet):
        raise TypeError(
            f"{str(source)!r} holds a {type(net).__name__}, not an imitation RewardNet"
        )
    return net.eval()
