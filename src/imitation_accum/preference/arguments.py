"""Checks of a preference trainer's arguments, made before anything is built."""

from typing import Any, Optional

import numpy as np
from imitation.algorithms import preference_comparisons as pc

from imitation_accum import _validation
from imitation_accum.planning import budget


def check_preference_model(model: pc.PreferenceModel, *, ensemble: bool) -> None:
    """Checks that ``model`` is imitation's preference model, of the right kind.

    Args:
        model: The trainer's ``preference_model``.
        ensemble: Whether the trainer trains a ``RewardEnsemble``.

    Raises:
        TypeError: if it is not, or it overrides how probabilities are computed.
    """
    if not isinstance(model, pc.PreferenceModel):
        raise TypeError(
            f"preference_model must be a PreferenceModel, got {type(model).__name__}",
        )
    for method in ("forward", "rewards", "probability"):
        if getattr(type(model), method) is not getattr(pc.PreferenceModel, method):
            raise TypeError(
                f"{type(model).__name__} overrides PreferenceModel.{method}; this "
                "trainer computes imitation's preference model and would ignore it",
            )
    if ensemble and model.ensemble_model is None:
        raise TypeError(
            "PreferenceModel of a RewardEnsemble expected by EnsembleTrainer.",
        )
    if not ensemble and model.ensemble_model is not None:
        raise TypeError(
            "the PreferenceModel wraps a RewardEnsemble: use "
            "imitation_accum.EnsembleTrainer (or make_reward_trainer)",
        )


def check_loss_and_rng(loss: pc.RewardLoss, rng: Any) -> None:
    """Checks the ``loss`` (imitation's cross-entropy) and ``rng`` arguments.

    Raises:
        TypeError: if either is of another kind.
    """
    if type(loss).forward is not pc.CrossEntropyRewardLoss.forward:
        raise TypeError(
            "loss must be imitation's CrossEntropyRewardLoss (the loss this "
            f"trainer accumulates exactly), got {type(loss).__name__}",
        )
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")


def check_minibatching(
    batch_size: object,
    minibatch_size: object,
    memory_budget: object,
) -> "tuple[int, Optional[int], Optional[budget.Budget]]":
    """Checks ``batch_size``, ``minibatch_size`` and ``memory_budget`` together.

    Returns:
        The three, checked (the budget parsed).

    Raises:
        ValueError: if a value is out of range, or both a minibatch size and a
            budget are given.
    """
    batch = _validation.positive_int("batch_size", batch_size)
    minibatch = _validation.optional_positive_int("minibatch_size", minibatch_size)
    _validation.minibatch_within_batch("minibatch_size", minibatch, "batch_size", batch)
    parsed = budget.parse_budget(memory_budget)
    if parsed is not None and minibatch is not None:
        raise ValueError(
            f"minibatch_size={minibatch_size!r} and memory_budget="
            f"{memory_budget!r} are alternatives: give one of them",
        )
    return batch, minibatch, parsed


def check_flag(name: str, value: object) -> bool:
    """Checks a bool argument.

    Raises:
        ValueError: if ``value`` is not a bool.
    """
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be a bool, got {value!r}")


def check_optional_flag(name: str, value: object) -> Optional[bool]:
    """Checks an argument that is ``None`` or a bool.

    Raises:
        ValueError: if ``value`` is neither.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be None or a bool, got {value!r}")
