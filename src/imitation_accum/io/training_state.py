"""The training state: what a run needs to continue where it stopped.

Only tensors and plain values (it loads with ``weights_only=True``); written atomically.
"""

import copy
import dataclasses
import pathlib
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch as th
from imitation.algorithms import preference_comparisons as pc
from torch import nn

from imitation_accum.io.atomic import AnyPath, atomic_save
from imitation_accum.io.safe_loading import pickled_globals, unwrapped

#: Name of the training state in a run's ``checkpoints`` directory.
TRAINING_STATE_NAME = "training_state.pt"
_STATE_FORMAT = "imitation_accum.training_state"
_STATE_VERSION = 1


@dataclasses.dataclass
class TrainingState:
    """Everything a run needs to continue after ``epoch`` completed epochs."""

    epoch: int  # epochs completed
    net_class: str  # qualified class name of the reward net
    net_state: Dict[str, th.Tensor]  # its state_dict (parameters, norm buffers)
    optimizer_class: str  # qualified class name of the optimizer
    optimizer_state: Dict[str, Any]  # its state_dict
    rng_state: Dict[str, Any]  # the trainer's numpy bit_generator.state
    torch_rng_state: th.Tensor  # torch's CPU generator (dropout)
    regularizer_lambda: Optional[float] = None  # as its updater left it
    cuda_rng_states: Optional[List[th.Tensor]] = None  # each CUDA device's generator
    # Plain values describing the run (dataset size, split), checked on resume.
    metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)


def _qualified_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def capture_state(
    trainer: pc.BasicRewardTrainer,
    *,
    epoch: int,
    metadata: Optional[Mapping[str, Any]] = None,
) -> TrainingState:
    """A copy of ``trainer``'s state after ``epoch`` epochs, ``metadata`` beside it."""
    net = unwrapped(trainer._preference_model.model)
    regularizer = getattr(trainer, "regularizer", None)
    return TrainingState(
        epoch=int(epoch),
        net_class=_qualified_name(net),
        net_state={k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
        optimizer_class=_qualified_name(trainer.optim),
        optimizer_state=copy.deepcopy(trainer.optim.state_dict()),
        rng_state=copy.deepcopy(dict(trainer.rng.bit_generator.state)),
        torch_rng_state=th.get_rng_state(),
        cuda_rng_states=th.cuda.get_rng_state_all() if th.cuda.is_available() else None,
        regularizer_lambda=None if regularizer is None else float(regularizer.lambda_),
        metadata=dict(metadata or {}),
    )


def save_training_state(state: TrainingState, path: AnyPath) -> pathlib.Path:
    """Writes ``state`` to ``path`` atomically and returns ``path``."""
    payload = {"format": _STATE_FORMAT, "version": _STATE_VERSION}
    payload.update(dataclasses.asdict(state))
    return atomic_save(payload, path)


def load_training_state(path: AnyPath) -> TrainingState:
    """Reads a state written by :func:`save_training_state` (tensors on the CPU).

    Raises:
        ValueError: if the file is missing, unreadable or not a training state.
    """
    source = pathlib.Path(path)
    where = f"checkpoint {str(source)!r}"
    if not source.is_file():
        raise ValueError(f"{where} does not exist")
    try:
        payload = th.load(source, map_location="cpu", weights_only=True)
    except Exception as error:
        classes = pickled_globals(source)
        if classes:  # a training state holds none: this is something else
            raise ValueError(
                f"{str(source)!r} is not a training state written by "
                f"imitation_accum: it pickles {', '.join(classes[:3])}"
                f"{', ...' * (len(classes) > 3)} (for a reward net alone, use "
                "load_reward_net)"
            ) from error
        raise ValueError(
            f"cannot read {where}: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(payload, dict) or payload.get("format") != _STATE_FORMAT:
        raise ValueError(
            f"{str(source)!r} is not a training state written by imitation_accum "
            "(for a reward net alone, use load_reward_net)"
        )
    if payload.get("version") != _STATE_VERSION:
        raise ValueError(
            f"{where} has format version {payload.get('version')}; this version "
            f"reads {_STATE_VERSION}"
        )
    fields = dataclasses.fields(TrainingState)
    missing = {
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    } - set(payload)
    if missing:
        raise ValueError(f"{where} lacks {', '.join(sorted(missing))}")
    return TrainingState(
        **{f.name: payload[f.name] for f in fields if f.name in payload}
    )


def check_fits(state: TrainingState, net: nn.Module, path: AnyPath) -> None:
    """Checks that ``state`` (read from ``path``) fits ``net``'s architecture.

    Raises:
        ValueError: naming ``path`` and the first differing class, key or shape.
    """
    net = unwrapped(net)
    here = net.state_dict()
    where = f"checkpoint {str(path)!r}"
    if state.net_class != _qualified_name(net):
        raise ValueError(
            f"{where} holds a {state.net_class}, but the reward net is a "
            f"{_qualified_name(net)}"
        )
    for key in sorted(state.net_state.keys() ^ here.keys()):
        detail = "has key {!r}, which the reward net lacks"
        if key in here:
            detail = "lacks key {!r} of the reward net"
        raise ValueError(f"{where} {detail.format(key)}")
    for key, value in here.items():
        saved = state.net_state[key]
        if tuple(saved.shape) != tuple(value.shape):
            raise ValueError(
                f"{where}: key {key!r} has shape {tuple(saved.shape)} there but "
                f"{tuple(value.shape)} in the reward net (another architecture)"
            )


def restore_state(
    trainer: pc.BasicRewardTrainer, state: TrainingState, path: AnyPath
) -> None:
    """Puts ``state`` (read from ``path``) back into ``trainer``, built as it was.

    Net, optimizer, generators and the regularizer's lambda.

    Raises:
        ValueError: naming ``path`` and what differs (architecture, optimizer,
            generator kind, regularizer).
    """
    net = unwrapped(trainer._preference_model.model)
    check_fits(state, net, path)
    where = f"checkpoint {str(path)!r}"
    if state.optimizer_class != _qualified_name(trainer.optim):
        raise ValueError(
            f"{where} holds {state.optimizer_class} state, but the trainer's "
            f"optimizer is a {_qualified_name(trainer.optim)}"
        )
    kind = trainer.rng.bit_generator.state["bit_generator"]
    if state.rng_state.get("bit_generator") != kind:
        raise ValueError(
            f"{where} holds the state of a {state.rng_state.get('bit_generator')} "
            f"generator, but the trainer's rng is a {kind}"
        )
    regularizer = getattr(trainer, "regularizer", None)
    if (regularizer is None) != (state.regularizer_lambda is None):
        raise ValueError(
            f"{where} was saved "
            f"{'with' if state.regularizer_lambda is not None else 'without'} a "
            "regularizer, but this run is configured "
            f"{'with' if regularizer is not None else 'without'} one"
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
    if state.cuda_rng_states and th.cuda.is_available():
        # On the devices both runs have.
        for index in range(min(len(state.cuda_rng_states), th.cuda.device_count())):
            th.cuda.set_rng_state(state.cuda_rng_states[index], index)
    if regularizer is not None:
        regularizer.lambda_ = state.regularizer_lambda


def apply_hyperparameters(
    optimizer: th.optim.Optimizer, values: Mapping[str, Any]
) -> Dict[str, Tuple[Any, Any]]:
    """Puts configured ``values`` (``lr``, ...) over those a restored state loaded.

    A resumed run trains with the hyperparameters its config records.

    Returns:
        Each hyperparameter that changed: ``name -> (checkpoint's, configured)``.
    """
    changed: Dict[str, Tuple[Any, Any]] = {}
    for name, value in values.items():
        for group in optimizer.param_groups:
            if name not in group:
                continue
            old = group[name]
            same = (
                tuple(old) == tuple(value)
                if isinstance(old, (list, tuple)) and isinstance(value, (list, tuple))
                else old == value
            )
            if not same:
                changed.setdefault(name, (old, value))
                group[name] = type(old)(value) if isinstance(old, tuple) else value
    return changed
