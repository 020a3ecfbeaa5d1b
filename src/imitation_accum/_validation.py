"""Argument checks shared by the trainers: clear errors before any training."""

import difflib
from typing import Any, Iterable, Mapping, Optional, TypeGuard, Union

import numpy as np


def _is_int(value: object) -> TypeGuard[Union[int, np.integer[Any]]]:
    return isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def _is_finite_number(value: object) -> TypeGuard[Union[int, float, np.number[Any]]]:
    return (
        isinstance(value, (int, float, np.number))
        and not isinstance(value, bool)
        and bool(np.isfinite(value))
    )


def boolean(name: str, value: object) -> bool:
    """``value`` as a ``bool`` if ``True`` or ``False`` (numpy's too), else an error.

    A command line's ``false`` or ``'no'`` reaches a config as a string, which is
    truthy: taking it would turn on what the user meant to turn off.

    Raises:
        ValueError: naming ``name``, for any other value.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool (True or False), got {value!r}.")
    return bool(value)


def optional_boolean(name: str, value: object) -> Optional[bool]:
    """Like :func:`boolean`, but lets ``None`` through."""
    if value is not None and not isinstance(value, (bool, np.bool_)):
        kind = "None or a bool (True or False)"
        raise ValueError(f"{name} must be {kind}, got {value!r}.")
    return None if value is None else bool(value)


def positive_int(name: str, value: object) -> int:
    """``value`` as an ``int`` if a positive int (not a bool), else ``ValueError``."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return int(value)


def optional_positive_int(name: str, value: object) -> Optional[int]:
    """Like :func:`positive_int`, but lets ``None`` through."""
    return None if value is None else positive_int(name, value)


def non_negative_int(name: str, value: object) -> int:
    """``value`` as an ``int`` if an int >= 0 (a seed; no bool), else ``ValueError``."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    return int(value)


def positive_count(name: str, value: object) -> int:
    """:func:`positive_int`, also of a whole float (``1e6`` on a command line)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    return positive_int(name, value)


def minibatch_within_batch(
    minibatch_name: str,
    minibatch_size: Optional[int],
    batch_name: str,
    batch_size: int,
) -> None:
    """Raises ``ValueError`` naming both if ``minibatch_size > batch_size``."""
    if minibatch_size is not None and minibatch_size > batch_size:
        raise ValueError(
            f"{minibatch_name}={minibatch_size} must not exceed "
            f"{batch_name}={batch_size}.",
        )


def finite_float(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 if ``allow_zero``), else ``ValueError``."""
    kind = "a finite number >= 0" if allow_zero else "a positive finite number"
    if not _is_finite_number(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {kind}, got {value!r}.")
    return float(value)


def positive_finite_float(name: str, value: object) -> float:
    """:func:`finite_float` without zero."""
    return finite_float(name, value)


def probability(name: str, value: object) -> float:
    """``value`` as a float if a number in [0, 1], else ``ValueError``."""
    if not _is_finite_number(value) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}.")
    return float(value)


def forward_size_arg(value: object, name: str = "forward_size") -> Union[int, str]:
    """A ``forward_size`` if a positive int or ``"auto"``, else ``ValueError``."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise ValueError(f"{name} must be a positive int or 'auto', got {value!r}.")
    return positive_int(name, value)


def known_names(
    key: str,
    given: Mapping[str, object],
    accepted: Iterable[str],
    target: str,
) -> None:
    """Checks that every name in ``given`` (from config ``key``) is ``target``'s.

    Raises:
        ValueError: naming the first name not in ``accepted``, with near matches.
    """
    accepted = list(accepted)
    for name in given:
        if name not in accepted:
            near = difflib.get_close_matches(str(name), accepted, n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            where = f"{key}.{name}" if key else str(name)
            raise ValueError(
                f"{where}: {target} has no argument {name!r}{hint} "
                f"(it takes: {', '.join(sorted(accepted))})",
            )
