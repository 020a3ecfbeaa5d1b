"""A preference trainer's settings and arguments, each parsed and checked once.

The trainers' constructors, their ``train()`` and the experiments' config hooks
share these checks; a config hook names the full key (``reward_trainer_kwargs.lr``).
"""

import dataclasses
import inspect
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc

from imitation_accum import _validation
from imitation_accum.engine import acceleration
from imitation_accum.planning import budget


@dataclasses.dataclass(frozen=True)
class TrainerSettings:
    """A preference trainer's settings, parsed and checked: what a ``train()`` uses.

    The constructor is the one check of each setting. The trainer builds it from
    its arguments, and again from its attributes at each ``train()``, so that an
    assigned setting is checked as a given one; a config hook builds it from
    ``reward_trainer_kwargs``. Fields and defaults are those of
    :class:`~imitation_accum.CrossEntropyRewardTrainer`'s arguments.

    Attributes:
        memory_budget: Bytes or ``"auto"`` once parsed (``"6GiB"`` given).
        acceleration: The options, once parsed (a mapping given).
        key_prefix: Put before each name in messages (``reward_trainer_kwargs.``).

    Raises:
        TypeError: naming a setting of the wrong type.
        ValueError: naming a setting out of range, or ``minibatch_size`` and
            ``memory_budget`` given together.
    """

    batch_size: int = 32
    minibatch_size: Optional[int] = None
    epochs: int = 1
    lr: float = 1e-3
    forward_size: Union[int, str] = "auto"
    drop_last: bool = False
    max_grad_norm: Optional[float] = None
    progress_bar: bool = True
    memory_budget: Optional[budget.Budget] = None
    autocast_dtype: Optional[str] = None
    activation_checkpointing: bool = False
    two_pass: Optional[bool] = None
    acceleration: Any = None
    key_prefix: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        def parse(field: str, check: Any, *args: Any, **kwargs: Any) -> None:
            name = f"{self.key_prefix}{field}"
            value = check(name, getattr(self, field), *args, **kwargs)
            object.__setattr__(self, field, value)  # frozen: the parsed value

        parse("batch_size", _validation.positive_int)
        parse("minibatch_size", _validation.positive_int, optional=True)
        given_budget = self.memory_budget
        parse("memory_budget", lambda n, v: budget.parse_budget(v, n))
        _validation.check_chunking(
            self.key_prefix,
            ("minibatch_size", self.minibatch_size),
            ("batch_size", self.batch_size),
            given_budget if self.memory_budget is not None else None,
        )
        parse("epochs", _validation.positive_int)
        parse("lr", _validation.finite_float, allow_zero=True)
        if self.forward_size != "auto":
            parse("forward_size", _forward_size)
        if self.max_grad_norm is not None:
            parse("max_grad_norm", _validation.finite_float)
        for flag in ("drop_last", "progress_bar", "activation_checkpointing"):
            parse(flag, _validation.boolean)
        parse("two_pass", _validation.boolean, optional=True)
        acceleration.parse_autocast_dtype(
            self.autocast_dtype, f"{self.key_prefix}autocast_dtype"
        )
        parse("acceleration", lambda n, v: acceleration.Acceleration.parse(v, n))

    @property
    def torch_autocast_dtype(self) -> Optional[th.dtype]:
        """``autocast_dtype`` as a torch dtype."""
        return acceleration.DTYPES.get(self.autocast_dtype or "")

    def check_device(self, device: th.device) -> None:
        """The checks that need the training device: autocast there, the budget fits.

        Raises:
            ValueError: naming ``autocast_dtype`` or ``memory_budget``.
        """
        try:
            acceleration.check_supported(self.torch_autocast_dtype, device)
        except ValueError as error:
            if not self.key_prefix:
                raise
            where = (
                f"{self.key_prefix}autocast_dtype={self.autocast_dtype!r} on {device}"
            )
            raise ValueError(f"{where}: {error}") from None
        budget.check_fits_device(
            self.memory_budget, device, f"{self.key_prefix}memory_budget"
        )


def _forward_size(name: str, value: object) -> int:
    if isinstance(value, str):  # not "auto"
        raise ValueError(f"{name} must be a positive int or 'auto', got {value!r}.")
    return int(_validation.positive_int(name, value))


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
        _validation.finite_float(f"{prefix}threshold", kwargs["threshold"])
