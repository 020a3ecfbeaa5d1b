"""AIRL/GAIL's settings and argument checks (constructors and sacred config alike)."""

import dataclasses
import inspect
from typing import Any, Dict, Mapping, Optional, Tuple

import torch as th
from imitation.algorithms.adversarial import common

from imitation_accum import _validation
from imitation_accum.engine import acceleration as acceleration_options
from imitation_accum.engine import arguments as engine_arguments
from imitation_accum.planning import budget


@dataclasses.dataclass(frozen=True)
class DiscriminatorSettings:
    """The discriminator update's settings, parsed and checked: what a step uses.

    The constructor is the one check of each setting. AIRL/GAIL build it from
    their arguments and again from their attributes at each ``train_disc()`` (an
    assigned setting is checked as a given one); the config hook from
    ``algorithm_kwargs``. Fields are the trainers' arguments, parsed:
    ``demo_minibatch_size`` holds its alias ``minibatch_size`` (then ``None``), and
    ``None`` for the whole batch (``demo_batch_size``, imitation's default, too);
    ``memory_budget`` is bytes or ``"auto"``, ``acceleration`` the options.
    ``key_prefix`` goes before each name in messages (``algorithm_kwargs.``).

    Raises:
        TypeError: naming a setting of the wrong type.
        ValueError: naming a setting out of range, the minibatch size and its
            alias disagreeing, or a minibatch size and a memory budget given
            together.
    """

    demo_batch_size: Any = None
    demo_minibatch_size: Optional[int] = None
    minibatch_size: Optional[int] = None
    max_grad_norm: Optional[float] = None
    memory_budget: Optional[budget.Budget] = None
    acceleration: Any = None
    key_prefix: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        prefix = self.key_prefix
        batch = _validation.positive_int(
            f"{prefix}demo_batch_size", self.demo_batch_size
        )
        given = {
            name: _validation.positive_int(f"{prefix}{name}", value)
            for name, value in (
                ("demo_minibatch_size", self.demo_minibatch_size),
                ("minibatch_size", self.minibatch_size),
            )
            if value is not None
        }
        if len(set(given.values())) > 1:
            raise ValueError(
                f"{prefix}demo_minibatch_size={self.demo_minibatch_size!r} and "
                f"{prefix}minibatch_size={self.minibatch_size!r} disagree: "
                "minibatch_size is an alias of demo_minibatch_size; give one of them.",
            )
        name, minibatch = next(iter(given.items()), ("", None))
        memory_budget = budget.parse_budget(
            self.memory_budget, f"{prefix}memory_budget"
        )
        whole_batch = minibatch == batch  # as imitation's default
        _validation.check_chunking(
            prefix,
            (name, minibatch),
            ("demo_batch_size", batch),
            None if memory_budget is None or whole_batch else self.memory_budget,
        )
        clip = self.max_grad_norm
        if clip is not None:
            clip = _validation.finite_float(f"{prefix}max_grad_norm", clip)
        options = acceleration_options.Acceleration.parse(
            self.acceleration, f"{prefix}acceleration"
        )
        for field, value in (
            ("demo_batch_size", batch),
            ("demo_minibatch_size", None if whole_batch else minibatch),
            ("minibatch_size", None),
            ("max_grad_norm", clip),
            ("memory_budget", memory_budget),
            ("acceleration", options),
        ):
            object.__setattr__(self, field, value)  # frozen: the parsed value

    def check_device(self, device: th.device) -> None:
        """The check that needs the training device: the budget fits.

        Raises:
            ValueError: naming ``memory_budget``.
        """
        budget.check_fits_device(
            self.memory_budget, device, f"{self.key_prefix}memory_budget"
        )


_IMITATION_DEFAULTS = inspect.signature(common.AdversarialTrainer).parameters
#: imitation's arguments that take only a bool (``allow_variable_horizon``, ...).
_IMITATION_FLAGS = tuple(
    name for name, p in _IMITATION_DEFAULTS.items() if p.annotation is bool
)
_SETTINGS = [f.name for f in dataclasses.fields(DiscriminatorSettings)]
#: imitation's discriminator optimizer.
DISC_OPT_CLS = _IMITATION_DEFAULTS["disc_opt_cls"].default


def check_arguments(
    kwargs: Mapping[str, Any],
    prefix: str = "",
) -> Tuple[DiscriminatorSettings, Dict[str, bool]]:
    """Checks the keyword arguments of AIRL/GAIL (others are left to imitation).

    ``prefix`` goes before each name in messages (``algorithm_kwargs.``).

    Returns:
        The discriminator's settings, and imitation's bool arguments given (numpy's
        bools as ``bool``).

    Raises:
        TypeError: naming an argument of the wrong type (``disc_opt_cls`` not an
            optimizer class, ``custom_logger`` not imitation's logger, ...).
        ValueError: naming an argument out of range (for ``disc_opt_kwargs``, the
            key the optimizer refuses), or as :class:`DiscriminatorSettings`.
    """
    settings = DiscriminatorSettings(
        **{k: v for k, v in kwargs.items() if k in _SETTINGS}, key_prefix=prefix
    )
    # imitation's default (2) passes.
    _validation.positive_int(
        f"{prefix}n_disc_updates_per_round",
        kwargs.get("n_disc_updates_per_round", 2),
    )
    if kwargs.get("gen_train_timesteps") is not None:
        _validation.positive_count(
            f"{prefix}gen_train_timesteps", kwargs["gen_train_timesteps"]
        )
    engine_arguments.check_optimizer(
        kwargs.get("disc_opt_cls", DISC_OPT_CLS),
        kwargs.get("disc_opt_kwargs"),
        cls_name=f"{prefix}disc_opt_cls",
        kwargs_name=f"{prefix}disc_opt_kwargs",
    )
    engine_arguments.check_logger(f"{prefix}custom_logger", kwargs.get("custom_logger"))
    # A string such as "false" is truthy: imitation would take it as True.
    flags = {
        name: bool(_validation.boolean(f"{prefix}{name}", kwargs[name]))
        for name in _IMITATION_FLAGS
        if name in kwargs
    }
    return settings, flags
