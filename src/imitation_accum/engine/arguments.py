"""Checks of what a trainer hands the engine: its optimizer, logger, regularizer.

Shared by the trainers' constructors and the config hooks. The optimizer is built
(on a dummy parameter where the net's are not at hand) so that torch's own refusal
of an argument is named with the argument.
"""

import inspect
from typing import Any, Iterable, Mapping, Optional, Type

import torch as th
from imitation.regularization import regularizers
from imitation.util import logger as imit_logger

from imitation_accum import _validation


def optimizer_class(name: str, value: object) -> Type[th.optim.Optimizer]:
    """``value`` if a ``torch.optim.Optimizer`` subclass: the one check of one.

    Raises:
        TypeError: naming ``name``, if ``value`` is a name, an instance or else.
    """
    if isinstance(value, type) and issubclass(value, th.optim.Optimizer):
        return value
    hint = f" (torch.optim.{value}, not its name)" if isinstance(value, str) else ""
    raise TypeError(
        f"{name} must be a torch.optim.Optimizer subclass{hint}, got {value!r}",
    )


def make_optimizer(
    params: Iterable[th.Tensor],
    optimizer_cls: object,
    optimizer_kwargs: Optional[Mapping[str, Any]],
    *,
    defaults: Optional[Mapping[str, Any]] = None,
    cls_name: str = "optimizer_cls",
    kwargs_name: str = "optimizer_kwargs",
) -> th.optim.Optimizer:
    """``optimizer_cls(params, **defaults, **optimizer_kwargs)``, naming bad input.

    Args:
        params: The parameters to optimize.
        optimizer_cls: A ``torch.optim.Optimizer`` subclass.
        optimizer_kwargs: Its further arguments, or ``None``.
        defaults: Arguments given apart (the trainer's ``lr``), overridden by
            ``optimizer_kwargs``; checked by their own argument's check.
        cls_name: The class argument's name, for messages.
        kwargs_name: The arguments' name, for messages (``optimizer_kwargs``).

    Returns:
        The optimizer.

    Raises:
        TypeError: if ``optimizer_cls`` is not an optimizer class or
            ``optimizer_kwargs`` not a mapping.
        ValueError: if ``optimizer_kwargs`` holds ``params`` or an argument the
            class does not take (with near matches), or one it refuses; naming
            ``kwargs_name`` and the key the optimizer refuses (every key, if no
            single one is refused on its own).
    """
    cls = optimizer_class(cls_name, optimizer_cls)
    if optimizer_kwargs is None:
        optimizer_kwargs = {}
    if not isinstance(optimizer_kwargs, Mapping):
        raise TypeError(
            f"{kwargs_name} must be None or a dict, got {optimizer_kwargs!r}",
        )
    if "params" in optimizer_kwargs:
        raise ValueError(
            f"{kwargs_name}.params: the trainer passes the parameters itself"
        )
    signature = inspect.signature(cls).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in signature.values()):
        accepted = [name for name in signature if name not in ("self", "params")]
        _validation.known_names(kwargs_name, optimizer_kwargs, accepted, cls.__name__)
    given = {**(defaults or {}), **optimizer_kwargs}
    try:
        return cls(params, **given)
    except Exception as error:  # torch's and custom optimizers' own checks
        keys = [key for key in optimizer_kwargs if _refuses(cls, defaults, key, given)]
        named = ", ".join(
            f"{kwargs_name}.{key}={optimizer_kwargs[key]!r}"
            for key in keys or optimizer_kwargs
        )
        raise ValueError(
            f"{named or kwargs_name} refused by {cls.__name__}: "
            f"{type(error).__name__}: {error}",
        ) from error


def _refuses(
    cls: Type[th.optim.Optimizer],
    defaults: Optional[Mapping[str, Any]],
    key: str,
    given: Mapping[str, Any],
) -> bool:
    """Whether ``cls`` refuses argument ``key`` alone (with the defaults)."""
    dummy = th.zeros(1, requires_grad=True)
    try:
        cls([dummy], **{**(defaults or {}), key: given[key]})
    except Exception:
        return True
    return False


def check_optimizer(
    optimizer_cls: object,
    optimizer_kwargs: Optional[Mapping[str, Any]],
    *,
    defaults: Optional[Mapping[str, Any]] = None,
    cls_name: str = "optimizer_cls",
    kwargs_name: str = "optimizer_kwargs",
) -> None:
    """:func:`make_optimizer` on a dummy parameter, before any net exists."""
    make_optimizer(
        [th.zeros(1, requires_grad=True)],
        optimizer_cls,
        optimizer_kwargs,
        defaults=defaults,
        cls_name=cls_name,
        kwargs_name=kwargs_name,
    )


def check_logger(name: str, value: object) -> None:
    """Raises ``TypeError`` naming ``name`` unless ``value`` is ``None`` or a logger.

    The logger is imitation's ``HierarchicalLogger``, what its trainers log to.
    """
    if value is not None and not isinstance(value, imit_logger.HierarchicalLogger):
        raise TypeError(
            f"{name} must be None or an imitation HierarchicalLogger "
            f"(imitation.util.logger.configure()), got {value!r}",
        )


def check_regularizer_factory(name: str, value: object) -> None:
    """Raises ``TypeError`` naming ``name`` unless ``value`` is ``None`` or callable."""
    if value is not None and not callable(value):
        raise TypeError(
            f"{name} must be None or a regularizer factory (such as "
            f"LpRegularizer.create(...)), got {value!r}",
        )


def make_regularizer(
    name: str,
    factory: Optional[regularizers.RegularizerFactory],
    optimizer: th.optim.Optimizer,
    logger: imit_logger.HierarchicalLogger,
) -> Optional[regularizers.Regularizer]:
    """``factory(optimizer=..., logger=...)``, checked to give an imitation regularizer.

    Raises:
        TypeError: naming ``name`` if ``factory`` is not callable or gives something
            else than a ``Regularizer``.
    """
    check_regularizer_factory(name, factory)
    if factory is None:
        return None
    regularizer = factory(optimizer=optimizer, logger=logger)
    if not isinstance(regularizer, regularizers.Regularizer):
        raise TypeError(
            f"{name} must build an imitation Regularizer, built {regularizer!r}",
        )
    return regularizer
