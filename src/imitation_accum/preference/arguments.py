"""Checks of a preference trainer's arguments, made before anything is built.

The trainers' constructors and the experiments' config hooks share them; a config
hook names the full key (``reward_trainer_kwargs.lr``).
"""

import inspect
from typing import Any, Mapping, Optional

import numpy as np
from imitation.algorithms import preference_comparisons as pc

from imitation_accum import _validation
from imitation_accum.engine import acceleration
from imitation_accum.engine import arguments as engine_arguments
from imitation_accum.planning import budget


def check_preference_model(model: pc.PreferenceModel, *, ensemble: bool) -> None:
    """Checks that ``model`` is imitation's preference model, of the right kind.

    Args:
        model: The trainer's ``preference_model``.
        ensemble: Whether the trainer trains a ``RewardEnsemble``.

    Raises:
        TypeError: if it is not, or it overrides how probabilities are computed.
        ValueError: if its ``noise_prob``, ``discount_factor`` or ``threshold``
            is out of range.
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
    check_preference_model_values(
        {
            "noise_prob": model.noise_prob,
            "discount_factor": model.discount_factor,
            "threshold": model.threshold,
        },
        "preference_model.",
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


def check_preference_model_values(
    kwargs: Mapping[str, Any],
    prefix: str = "",
) -> None:
    """Checks the arguments of imitation's ``PreferenceModel`` (but the model).

    Args:
        kwargs: Some of ``noise_prob``, ``discount_factor`` and ``threshold``.
        prefix: Prepended to each name in messages (``preference_model_kwargs.``).

    Raises:
        ValueError: naming the unknown argument (with near matches) or the value
            out of range.
    """
    accepted = [
        name
        for name in inspect.signature(pc.PreferenceModel.__init__).parameters
        if name not in ("self", "model")
    ]
    _validation.known_names(prefix.rstrip("."), kwargs, accepted, "PreferenceModel")
    if "noise_prob" in kwargs:
        _validation.probability(f"{prefix}noise_prob", kwargs["noise_prob"])
    if "discount_factor" in kwargs:
        _validation.probability(f"{prefix}discount_factor", kwargs["discount_factor"])
    if "threshold" in kwargs:
        _validation.positive_finite_float(f"{prefix}threshold", kwargs["threshold"])


def check_trainer_values(
    kwargs: Mapping[str, Any],
    prefix: str = "",
    optimizer_cls: Optional[type] = None,
) -> None:
    """Checks the values of a preference trainer's keyword arguments.

    What the constructor checks, also from a config before anything is built.
    Arguments not given are not checked (their defaults are valid).

    Args:
        kwargs: Keyword arguments of ``CrossEntropyRewardTrainer``.
        prefix: Prepended to each name in messages (``reward_trainer_kwargs.``).
        optimizer_cls: The optimizer class, to check ``optimizer_kwargs`` against.

    Raises:
        ValueError: naming the first invalid argument, or both ``minibatch_size``
            and ``memory_budget`` when both are given.
    """
    batch_name, minibatch_name = f"{prefix}batch_size", f"{prefix}minibatch_size"
    batch = _validation.positive_int(batch_name, kwargs.get("batch_size", 32))
    minibatch_size = kwargs.get("minibatch_size")
    minibatch = _validation.optional_positive_int(minibatch_name, minibatch_size)
    _validation.minibatch_within_batch(minibatch_name, minibatch, batch_name, batch)
    memory_budget = kwargs.get("memory_budget")
    budget_name = f"{prefix}memory_budget"
    if budget.parse_budget(memory_budget, budget_name) is not None and (
        minibatch is not None
    ):
        raise ValueError(
            f"{minibatch_name}={minibatch_size!r} and {budget_name}="
            f"{memory_budget!r} are alternatives: give one of them",
        )
    if "epochs" in kwargs:
        _validation.positive_int(f"{prefix}epochs", kwargs["epochs"])
    if "lr" in kwargs:
        _validation.finite_float(f"{prefix}lr", kwargs["lr"], allow_zero=True)
    if "forward_size" in kwargs:
        _validation.forward_size_arg(kwargs["forward_size"], f"{prefix}forward_size")
    if kwargs.get("max_grad_norm") is not None:
        _validation.positive_finite_float(
            f"{prefix}max_grad_norm", kwargs["max_grad_norm"]
        )
    acceleration.parse_autocast_dtype(
        kwargs.get("autocast_dtype"), f"{prefix}autocast_dtype"
    )
    for flag in ("drop_last", "progress_bar", "activation_checkpointing"):
        if flag in kwargs:
            _validation.boolean(f"{prefix}{flag}", kwargs[flag])
    _validation.optional_boolean(f"{prefix}two_pass", kwargs.get("two_pass"))
    if optimizer_cls is not None:
        engine_arguments.check_optimizer(
            optimizer_cls,
            kwargs.get("optimizer_kwargs"),
            defaults={"lr": kwargs.get("lr", 1e-3)},
            cls_name=f"{prefix}optimizer_cls",
            kwargs_name=f"{prefix}optimizer_kwargs",
        )
