"""AIRL/GAIL's argument checks (constructors and sacred config alike), and layouts."""

import dataclasses
import inspect
from typing import Any, Mapping, Optional

from imitation.algorithms.adversarial import common

from imitation_accum import _validation
from imitation_accum.engine import acceleration as acceleration_options
from imitation_accum.engine import arguments as engine_arguments
from imitation_accum.planning import budget


@dataclasses.dataclass(frozen=True)
class DiscriminatorArguments:
    """The checked arguments of the discriminator update."""

    demo_batch_size: int
    demo_minibatch_size: Optional[int]
    """``None`` for the whole batch."""
    max_grad_norm: Optional[float]
    memory_budget: Optional[budget.Budget]
    acceleration: acceleration_options.Acceleration
    flags: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """imitation's bool arguments that were given, as ``bool``."""


_IMITATION_DEFAULTS = inspect.signature(common.AdversarialTrainer).parameters
#: imitation's arguments that take only a bool (``allow_variable_horizon``, ...).
_IMITATION_FLAGS = tuple(
    name for name, p in _IMITATION_DEFAULTS.items() if p.annotation is bool
)


def check_arguments(
    kwargs: Mapping[str, Any],
    prefix: str = "",
) -> DiscriminatorArguments:
    """Checks the keyword arguments of an AIRL/GAIL trainer.

    Args:
        kwargs: Keyword arguments of ``imitation_accum.AIRL`` or ``GAIL``; those
            not checked here are left to imitation.
        prefix: Prepended to each name in messages (``algorithm_kwargs.``).

    Returns:
        The arguments the discriminator update reads, checked, and imitation's
        bool arguments given (numpy's bools as ``bool``).

    Raises:
        ValueError: naming the first invalid argument (for ``disc_opt_kwargs``,
            the key the optimizer refuses), or the minibatch size and the memory
            budget given together.
        TypeError: if ``disc_opt_cls`` is not an optimizer class or
            ``custom_logger`` not imitation's logger.
    """
    batch_size = _validation.positive_int(
        f"{prefix}demo_batch_size", kwargs.get("demo_batch_size")
    )
    minibatch_size = resolve_minibatch_size(
        kwargs.get("demo_minibatch_size"),
        kwargs.get("minibatch_size"),
        batch_size,
        prefix,
    )
    clip = check_max_grad_norm(kwargs.get("max_grad_norm"), prefix)
    memory_budget = kwargs.get("memory_budget")
    parsed_budget = budget.parse_budget(memory_budget, f"{prefix}memory_budget")
    if parsed_budget is not None and minibatch_size is not None:
        raise ValueError(
            f"{prefix}demo_minibatch_size (or minibatch_size)={minibatch_size!r} and "
            f"{prefix}memory_budget={memory_budget!r} are alternatives: give one of "
            "them",
        )
    options = acceleration_options.Acceleration.parse(
        kwargs.get("acceleration"), f"{prefix}acceleration"
    )
    # imitation's defaults (2, None, None) pass these checks.
    _validation.positive_int(
        f"{prefix}n_disc_updates_per_round",
        kwargs.get("n_disc_updates_per_round", 2),
    )
    if kwargs.get("gen_train_timesteps") is not None:
        _validation.positive_count(
            f"{prefix}gen_train_timesteps", kwargs["gen_train_timesteps"]
        )
    opt_kwargs = kwargs.get("disc_opt_kwargs")
    if opt_kwargs is not None and not isinstance(opt_kwargs, Mapping):
        raise ValueError(f"{prefix}disc_opt_kwargs must be None or a dict")
    engine_arguments.check_optimizer(
        kwargs.get("disc_opt_cls", _IMITATION_DEFAULTS["disc_opt_cls"].default),
        opt_kwargs,
        cls_name=f"{prefix}disc_opt_cls",
        kwargs_name=f"{prefix}disc_opt_kwargs",
    )
    engine_arguments.check_logger(f"{prefix}custom_logger", kwargs.get("custom_logger"))
    # A string such as "false" is truthy: imitation would take it as True.
    flags = {
        name: _validation.boolean(f"{prefix}{name}", kwargs[name])
        for name in _IMITATION_FLAGS
        if name in kwargs
    }
    return DiscriminatorArguments(
        demo_batch_size=batch_size,
        demo_minibatch_size=minibatch_size,
        max_grad_norm=clip,
        memory_budget=parsed_budget,
        acceleration=options,
        flags=flags,
    )


def resolve_minibatch_size(
    demo_minibatch_size: object,
    minibatch_size: object,
    demo_batch_size: int,
    prefix: str = "",
) -> Optional[int]:
    """Checks ``demo_minibatch_size`` and its alias ``minibatch_size``.

    Args:
        demo_minibatch_size: imitation's name for the minibatch size.
        minibatch_size: The alias.
        demo_batch_size: The batch size the minibatch must not exceed.
        prefix: Prepended to each name in messages (``algorithm_kwargs.``).

    Returns:
        The minibatch size, or ``None`` (neither given): the whole batch.

    Raises:
        ValueError: if a size is not a positive int, exceeds ``demo_batch_size``, or
            the two disagree.
    """
    given = {
        name: _validation.positive_int(name, value)
        for name, value in (
            (f"{prefix}demo_minibatch_size", demo_minibatch_size),
            (f"{prefix}minibatch_size", minibatch_size),
        )
        if value is not None
    }
    if len(set(given.values())) > 1:
        raise ValueError(
            f"{prefix}demo_minibatch_size={demo_minibatch_size!r} and "
            f"{prefix}minibatch_size={minibatch_size!r} disagree: minibatch_size "
            "is an alias of demo_minibatch_size; give one of them.",
        )
    if not given:
        return None
    name, value = next(iter(given.items()))
    _validation.minibatch_within_batch(
        name, value, f"{prefix}demo_batch_size", demo_batch_size
    )
    return value


def check_max_grad_norm(value: object, prefix: str = "") -> Optional[float]:
    """``max_grad_norm`` if ``None`` or positive and finite, else ``ValueError``."""
    if value is None:
        return None
    return _validation.positive_finite_float(f"{prefix}max_grad_norm", value)
