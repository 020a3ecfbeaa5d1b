"""Argument checks shared by the trainers: clear errors before any training."""

import difflib
from typing import Any, Iterable, Mapping, Optional, TypeGuard, Union

import numpy as np


def _is_int(value: object) -> TypeGuard[Union[int, np.integer[Any]]]:
    return isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def positive_int(name: str, value: object) -> int:
    """Returns ``value`` as an ``int`` if it is a positive int (not a bool).

    Raises:
        ValueError: naming ``name`` otherwise.
    """
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return int(value)


def optional_positive_int(name: str, value: object) -> Optional[int]:
    """Like :func:`positive_int`, but lets ``None`` through."""
    return None if value is None else positive_int(name, value)


def non_negative_int(name: str, value: object) -> int:
    """Returns ``value`` as an ``int`` if it is an int of at least 0 (a seed).

    Raises:
        ValueError: naming ``name`` otherwise (bools are rejected too).
    """
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}.")
    return int(value)


def positive_count(name: str, value: object) -> int:
    """A positive whole number, also written as a float (``1e6`` on a command line).

    Raises:
        ValueError: naming ``name`` if ``value`` is not a positive whole number.
    """
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    return positive_int(name, value)


def minibatch_within_batch(
    minibatch_name: str,
    minibatch_size: Optional[int],
    batch_name: str,
    batch_size: int,
) -> None:
    """Checks that a minibatch (``None``: the whole batch) is no larger than its batch.

    Raises:
        ValueError: naming both arguments if ``minibatch_size > batch_size``.
    """
    if minibatch_size is not None and minibatch_size > batch_size:
        raise ValueError(
            f"{minibatch_name}={minibatch_size} must not exceed "
            f"{batch_name}={batch_size}.",
        )


def finite_float(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Returns ``value`` as a float if it is finite and positive (or zero).

    Raises:
        ValueError: naming ``name`` if ``value`` is not a finite number above 0
            (or at least 0, with ``allow_zero``).
    """
    kind = "a finite number >= 0" if allow_zero else "a positive finite number"
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.number))
        or not np.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        raise ValueError(f"{name} must be {kind}, got {value!r}.")
    return float(value)


def positive_finite_float(name: str, value: object) -> float:
    """:func:`finite_float` without zero."""
    return finite_float(name, value)


def probability(name: str, value: object) -> float:
    """Returns ``value`` as a float if it is a finite number in [0, 1].

    Raises:
        ValueError: naming ``name`` otherwise.
    """
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, float, np.number))
        or not np.isfinite(value)
        or not 0 <= value <= 1
    ):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}.")
    return float(value)


def forward_size_arg(value: object, name: str = "forward_size") -> Union[int, str]:
    """Checks a ``forward_size``: a positive int or ``"auto"``.

    Raises:
        ValueError: naming ``name`` otherwise.
    """
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
    """Checks that every name in ``given`` is one of ``accepted``, ``target``'s.

    ``key`` is where ``given`` comes from (a config key such as ``regularizer``).

    Raises:
        ValueError: naming the first unknown ``key.name``, with near matches.
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
