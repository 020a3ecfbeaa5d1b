"""Atomic checkpoints, and reward nets saved in imitation's format.

Two kinds of file are written here, both atomically (a temporary file in the same
directory, flushed and ``fsync``-ed, then ``os.replace``-d over the target, so a
reader sees the old file or the new one, never a part of one):

* a reward net alone, as imitation saves it (``th.save`` of the whole module): it
  loads with imitation's ``imitation.rewards.serialize.load_reward`` and with
  :func:`load_reward_net`;
* a :class:`TrainingState`: everything needed to continue training where it
  stopped. It holds only tensors and plain Python values, so it loads with
  ``torch.load(weights_only=True)`` without any registration.

torch 2.6 and later load with ``weights_only=True`` by default, which refuses the
pickled module imitation 1.0.1 saves and loads, so ``load_reward`` fails on every
reward net. A file format that both keeps imitation's loader working and avoids
pickled classes does not exist (a TorchScript archive is refused by
``weights_only`` loading, a ``state_dict`` is not a module), so importing this
module (which ``import imitation_accum`` does) registers, with
``torch.serialization.add_safe_globals``, the classes that a reward net built from
imitation's and torch's layers pickles: imitation's reward nets and norm layers,
torch's ``nn`` layers, gymnasium's spaces and the numpy types they hold. Nothing
else is allowed, so loading stays safe; a net of another class needs
:func:`register_safe_classes` (or, for a trusted file, ``weights_only=False``).
"""

import contextlib
import copy
import dataclasses
import importlib
import inspect
import os
import pathlib
import pickle
import secrets
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.algorithms.adversarial import gail
from imitation.rewards import reward_nets
from imitation.util import networks
from torch import nn

from imitation_accum import reward_nets as accum_reward_nets

AnyPath = Union[str, os.PathLike]

#: Suffix of the temporary files atomic writes go through.
TEMPORARY_SUFFIX = ".partial"
#: Name of the training state in a run's ``checkpoints`` directory.
TRAINING_STATE_NAME = "training_state.pt"
_STATE_FORMAT = "imitation_accum.training_state"
_STATE_VERSION = 1

SafeGlobal = Union[Callable[..., Any], Tuple[Callable[..., Any], str]]


def _module_classes(namespace: Mapping[str, Any]) -> List[type]:
    return [
        value
        for value in namespace.values()
        if inspect.isclass(value) and issubclass(value, nn.Module)
    ]


def _numpy_globals() -> List[SafeGlobal]:
    """What gymnasium spaces pickle: arrays, dtypes, scalars and their generators."""
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
    found += [
        np.random.Generator,
        np.random.PCG64,
        np.random.PCG64DXSM,
        np.random.MT19937,
        np.random.Philox,
        np.random.SFC64,
        bit_generator.SeedSequence,
    ]
    found += [
        getattr(random_pickle, name)
        for name in ("__generator_ctor", "__bit_generator_ctor")
        if hasattr(random_pickle, name)
    ]
    unpickle_seed = getattr(bit_generator, "__pyx_unpickle_SeedSequence", None)
    if unpickle_seed is not None:
        found.append(unpickle_seed)
    return found


def default_safe_globals() -> List[SafeGlobal]:
    """The classes and functions a reward net of imitation's kinds pickles.

    Returns:
        imitation's and this package's reward-net classes (GAIL's
        discriminator-logit reward too), imitation's norm layers, every
        ``torch.nn`` layer,
        gymnasium's array spaces and the numpy types and generator constructors
        that they hold.
    """
    found: List[SafeGlobal] = []
    found += _module_classes(vars(reward_nets))
    # This package's nets (AIRL's shaped CNN on frames) load like imitation's.
    found += _module_classes(vars(accum_reward_nets))
    # GAIL's reward_train.pt: the discriminator seen as a reward.
    found.append(gail.RewardNetFromDiscriminatorLogit)
    found += _module_classes(vars(networks))
    found += _module_classes(vars(nn))
    found += [
        gym.spaces.Box,
        gym.spaces.Discrete,
        gym.spaces.MultiDiscrete,
        gym.spaces.MultiBinary,
    ]
    found += _numpy_globals()
    return found


def register_safe_classes(*classes: SafeGlobal) -> None:
    """Lets ``torch.load(weights_only=True)`` rebuild objects of ``classes``.

    Call it, before loading, for a reward net of a class of your own (and any
    class it holds): imitation's loader and :func:`load_reward_net` then load it.

    Args:
        *classes: Classes or functions, or ``(object, "module.name")`` pairs.

    Example:
        >>> register_safe_classes(MyRewardNet)  # doctest: +SKIP
    """
    th.serialization.add_safe_globals(list(classes))


register_safe_classes(*default_safe_globals())


def _fsync_directory(directory: pathlib.Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_save(obj: Any, path: AnyPath) -> pathlib.Path:
    """``th.save(obj, path)``, such that ``path`` never holds a partial file.

    The object is written to a temporary file next to ``path`` (same directory,
    hence same file system), flushed and ``fsync``-ed, then renamed over ``path``
    with ``os.replace``. If anything fails the temporary file is removed and any
    earlier file at ``path`` is left as it was.

    Args:
        obj: What to save.
        path: Where; parent directories are created.

    Returns:
        ``path`` as a ``pathlib.Path``.
    """
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = _make_temporary(target)
    try:
        with os.fdopen(fd, "wb") as file:
            th.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(target.parent)
    return target


def _make_temporary(target: pathlib.Path) -> Tuple[int, str]:
    # Like tempfile.mkstemp, but with the permissions th.save would give (the
    # umask applies) rather than owner-only ones.
    while True:
        name = f".{target.name}.{secrets.token_hex(6)}{TEMPORARY_SUFFIX}"
        path = target.parent / name
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(path)
        except FileExistsError:
            continue


def remove_stale_temporaries(path: AnyPath) -> List[pathlib.Path]:
    """Deletes temporary files left by an atomic write to ``path`` that was killed.

    A process killed by a signal in the middle of :func:`atomic_save` cannot clean
    up; its temporary file is harmless (``path`` itself is intact) but useless.

    Args:
        path: The target path of earlier atomic writes.

    Returns:
        The files removed.
    """
    target = pathlib.Path(path)
    if not target.parent.is_dir():
        return []
    removed = []
    for stale in target.parent.glob(f".{target.name}.*{TEMPORARY_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            removed.append(stale)
    return removed


def _unwrapped(net: nn.Module) -> nn.Module:
    # A DistributedDataParallel (or DataParallel) wrapper is not part of the net.
    inner = getattr(net, "module", None)
    return inner if isinstance(inner, nn.Module) else net


def save_reward_net(net: nn.Module, path: AnyPath) -> pathlib.Path:
    """Saves ``net`` as imitation does (the whole module), atomically, on the CPU.

    imitation's ``train_preference_comparisons`` writes ``th.save(net, path)``; so
    does this, from a CPU copy so that the file loads on a machine without the
    training device. A ``DistributedDataParallel`` wrapper is removed first.

    Args:
        net: The reward net.
        path: Where to save it (``.../reward_net.pt`` by imitation's convention).

    Returns:
        ``path`` as a ``pathlib.Path``.

    Raises:
        TypeError: if ``net`` is not an imitation ``RewardNet``.
    """
    net = _unwrapped(net)
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
    """Globals in a saved file that ``weights_only`` loading does not allow yet.

    Args:
        path: A file written by ``th.save``.

    Returns:
        Their qualified names; empty if the file loads with ``weights_only=True``
        (and for files torch cannot read, or on torch versions that cannot tell).
    """
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
        weights_only: Keep ``torch.load``'s safe loading, which rebuilds only
            registered classes (see :func:`register_safe_classes`). ``False``
            runs arbitrary code from the file: only for files you trust.

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
            "weights_only=False if you trust the file.",
        ) from error
    except Exception as error:
        raise ValueError(
            f"cannot read the reward net in {str(source)!r}: "
            f"{type(error).__name__}: {error}",
        ) from error
    if not isinstance(net, reward_nets.RewardNet):
        raise TypeError(
            f"{str(source)!r} holds a {type(net).__name__}, not an imitation RewardNet",
        )
    return net.eval()


@dataclasses.dataclass
class TrainingState:
    """Everything a run needs to continue after ``epoch`` completed epochs."""

    epoch: int
    """Epochs completed."""
    net_class: str
    """Qualified class name of the reward net."""
    net_state: Dict[str, th.Tensor]
    """The reward net's ``state_dict`` (parameters and norm buffers)."""
    optimizer_class: str
    """Qualified class name of the optimizer."""
    optimizer_state: Dict[str, Any]
    """The optimizer's ``state_dict``."""
    rng_state: Dict[str, Any]
    """The trainer's numpy generator (``bit_generator.state``)."""
    torch_rng_state: th.Tensor
    """torch's CPU generator (dropout)."""
    regularizer_lambda: Optional[float] = None
    """The regularizer's lambda, which its updater changes during training."""
    metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)
    """Plain values describing the run (dataset size, split), checked on resume."""


def _qualified_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def capture_state(
    trainer: pc.BasicRewardTrainer,
    *,
    epoch: int,
    metadata: Optional[Mapping[str, Any]] = None,
) -> TrainingState:
    """The training state of ``trainer`` after ``epoch`` completed epochs.

    Args:
        trainer: A reward trainer with ``optim``, ``rng`` and ``regularizer``.
        epoch: Epochs completed.
        metadata: Plain values to check on resume.

    Returns:
        Copies of the state, safe to write while training goes on.
    """
    net = _unwrapped(trainer._preference_model.model)
    regularizer = getattr(trainer, "regularizer", None)
    return TrainingState(
        epoch=int(epoch),
        net_class=_qualified_name(net),
        net_state={k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
        optimizer_class=_qualified_name(trainer.optim),
        optimizer_state=copy.deepcopy(trainer.optim.state_dict()),
        rng_state=copy.deepcopy(dict(trainer.rng.bit_generator.state)),
        torch_rng_state=th.get_rng_state(),
        regularizer_lambda=None if regularizer is None else float(regularizer.lambda_),
        metadata=dict(metadata or {}),
    )


def save_training_state(state: TrainingState, path: AnyPath) -> pathlib.Path:
    """Writes ``state`` to ``path`` atomically.

    Args:
        state: What to save.
        path: Where.

    Returns:
        ``path`` as a ``pathlib.Path``.
    """
    payload = {"format": _STATE_FORMAT, "version": _STATE_VERSION}
    payload.update(dataclasses.asdict(state))
    return atomic_save(payload, path)


def load_training_state(path: AnyPath) -> TrainingState:
    """Reads a state written by :func:`save_training_state`.

    Args:
        path: The file.

    Returns:
        The state, tensors on the CPU.

    Raises:
        ValueError: if the file is missing, unreadable or not a training state.
    """
    source = pathlib.Path(path)
    if not source.is_file():
        raise ValueError(f"checkpoint {str(source)!r} does not exist")
    try:
        payload = th.load(source, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(
            f"cannot read checkpoint {str(source)!r}: {type(error).__name__}: {error}",
        ) from error
    if not isinstance(payload, dict) or payload.get("format") != _STATE_FORMAT:
        raise ValueError(
            f"{str(source)!r} is not a training state written by imitation_accum "
            "(for a reward net alone, use load_reward_net)",
        )
    if payload.get("version") != _STATE_VERSION:
        raise ValueError(
            f"checkpoint {str(source)!r} has format version "
            f"{payload.get('version')}; this version reads {_STATE_VERSION}",
        )
    fields = {f.name for f in dataclasses.fields(TrainingState)}
    missing = fields - set(payload)
    if missing:
        raise ValueError(
            f"checkpoint {str(source)!r} lacks {', '.join(sorted(missing))}",
        )
    return TrainingState(**{k: payload[k] for k in fields})


def check_fits(state: TrainingState, net: nn.Module, path: AnyPath) -> None:
    """Checks that ``state`` was saved from a net of ``net``'s architecture.

    Args:
        state: A loaded training state.
        net: The reward net to restore into.
        path: The checkpoint's path, for messages.

    Raises:
        ValueError: naming ``path`` and the first differing key, if the class, the
            parameter and buffer names or their shapes differ.
    """
    net = _unwrapped(net)
    here = net.state_dict()
    where = f"checkpoint {str(path)!r}"
    if state.net_class != _qualified_name(net):
        raise ValueError(
            f"{where} holds a {state.net_class}, but the reward net is a "
            f"{_qualified_name(net)}",
        )
    for key in sorted(state.net_state.keys() - here.keys()):
        raise ValueError(f"{where} has key {key!r}, which the reward net lacks")
    for key in sorted(here.keys() - state.net_state.keys()):
        raise ValueError(f"{where} lacks key {key!r} of the reward net")
    for key, value in here.items():
        saved = state.net_state[key]
        if tuple(saved.shape) != tuple(value.shape):
            raise ValueError(
                f"{where}: key {key!r} has shape {tuple(saved.shape)} there but "
                f"{tuple(value.shape)} in the reward net (another architecture)",
            )


def restore_state(
    trainer: pc.BasicRewardTrainer,
    state: TrainingState,
    path: AnyPath,
) -> None:
    """Puts ``state`` back into ``trainer``: net, optimizer, generators, lambda.

    Args:
        trainer: The trainer to restore; built as for the run that saved ``state``.
        state: A loaded training state.
        path: The checkpoint's path, for messages.

    Raises:
        ValueError: naming ``path`` and what differs, if the state does not fit the
            trainer (architecture, optimizer, generator kind, regularizer).
    """
    net = _unwrapped(trainer._preference_model.model)
    check_fits(state, net, path)
    where = f"checkpoint {str(path)!r}"
    if state.optimizer_class != _qualified_name(trainer.optim):
        raise ValueError(
            f"{where} holds {state.optimizer_class} state, but the trainer's "
            f"optimizer is a {_qualified_name(trainer.optim)}",
        )
    kind = trainer.rng.bit_generator.state["bit_generator"]
    if state.rng_state.get("bit_generator") != kind:
        raise ValueError(
            f"{where} holds the state of a {state.rng_state.get('bit_generator')} "
            f"generator, but the trainer's rng is a {kind}",
        )
    regularizer = getattr(trainer, "regularizer", None)
    if (regularizer is None) != (state.regularizer_lambda is None):
        raise ValueError(
            f"{where} was saved "
            f"{'with' if state.regularizer_lambda is not None else 'without'} a "
            "regularizer, but this run is configured "
            f"{'with' if regularizer is not None else 'without'} one",
        )
    with th.no_grad():
        net.load_state_dict(state.net_state)
    try:
        trainer.optim.load_state_dict(state.optimizer_state)
    except (ValueError, KeyError) as error:
        raise ValueError(
            f"{where}: its optimizer state does not fit: {error}"
        ) from error
    trainer.rng.bit_generator.state = state.rng_state
    th.set_rng_state(state.torch_rng_state)
    if regularizer is not None:
        regularizer.lambda_ = state.regularizer_lambda
