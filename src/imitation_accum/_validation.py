"""Checks of single values, naming the argument or config key.

Every check raises ``TypeError`` for a value of the wrong type and ``ValueError``
for a value of the right type out of range, and returns the value normalized.
"""

import difflib
from typing import Any, Iterable, Mapping, Optional, Tuple, TypeGuard, Union

import numpy as np


def _is_int(value: object) -> TypeGuard[Union[int, np.integer[Any]]]:
    return isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def _is_number(value: object) -> TypeGuard[Union[int, float, np.number[Any]]]:
    return isinstance(value, (int, float, np.number)) and not isinstance(
        value, (bool, np.bool_)
    )


def boolean(name: str, value: object, *, optional: bool = False) -> Optional[bool]:
    """``value`` as a ``bool`` if ``True`` or ``False`` (numpy's too).

    A command line's ``false`` reaches a config as a string, which is truthy:
    taking it would turn on what the user meant to turn off.

    Args:
        name: The argument's name, for messages.
        value: What was given.
        optional: Whether ``None`` is taken (and returned).

    Raises:
        TypeError: naming ``name``, for any other value.
    """
    if optional and value is None:
        return None
    if not isinstance(value, (bool, np.bool_)):
        kind = "None or a bool" if optional else "a bool"
        raise TypeError(f"{name} must be {kind} (True or False), got {value!r}.")
    return bool(value)


def positive_int(name: str, value: object, *, optional: bool = False) -> Any:
    """``value`` as an ``int`` if a positive int (not a bool); ``None`` if ``optional``.

    Raises:
        TypeError: if ``value`` is not an int.
        ValueError: if it is below 1.
    """
    if optional and value is None:
        return None
    return _int_from(name, value, 1, "a positive int")


def non_negative_int(name: str, value: object) -> int:
    """``value`` as an ``int`` if an int >= 0 (a seed, a count).

    Raises:
        TypeError: if ``value`` is not an int.
        ValueError: if it is negative.
    """
    return _int_from(name, value, 0, "an int >= 0")


def _int_from(name: str, value: object, low: int, kind: str) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be {kind}, got {value!r}.")
    if value < low:
        raise ValueError(f"{name} must be {kind}, got {value!r}.")
    return int(value)


def positive_count(name: str, value: object) -> int:
    """:func:`positive_int`, also of a whole float (``1e6`` on a command line)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    return positive_int(name, value)


def check_chunking(
    prefix: str,
    minibatch: Tuple[str, Optional[int]],
    batch: Tuple[str, int],
    memory_budget: object,
) -> None:
    """Checks a (checked) minibatch size against its batch size and a memory budget.

    Args:
        prefix: Put before each name in messages (``reward_trainer_kwargs.``).
        minibatch: The minibatch size's name and value (``None``: the whole batch).
        batch: The batch size's name and value.
        memory_budget: The memory budget as given (``None``: none).

    Raises:
        ValueError: if the minibatch exceeds the batch, or a budget is given too.
    """
    (minibatch_name, minibatch_size), (batch_name, batch_size) = minibatch, batch
    if minibatch_size is None:
        return
    if minibatch_size > batch_size:
        raise ValueError(
            f"{prefix}{minibatch_name}={minibatch_size} must not exceed "
            f"{prefix}{batch_name}={batch_size}.",
        )
    if memory_budget is not None:
        raise ValueError(
            f"{prefix}{minibatch_name}={minibatch_size!r} and {prefix}memory_budget="
            f"{memory_budget!r} are alternatives: give one of them",
        )


def finite_float(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 if ``allow_zero``).

    Raises:
        TypeError: if ``value`` is not a number.
        ValueError: if it is not finite or out of range.
    """
    kind = "a finite number >= 0" if allow_zero else "a positive finite number"
    if not _is_number(value):
        raise TypeError(f"{name} must be {kind}, got {value!r}.")
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {kind}, got {value!r}.")
    return float(value)


def probability(name: str, value: object) -> float:
    """``value`` as a float if a number in [0, 1].

    Raises:
        TypeError: if ``value`` is not a number.
        ValueError: if it lies outside [0, 1] (or is NaN).
    """
    if not _is_number(value):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r}.")
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}.")
    return float(value)


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
