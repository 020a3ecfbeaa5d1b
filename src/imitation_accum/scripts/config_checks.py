"""Config checks of this package's experiments, run in sacred config hooks.

Each runs before anything is built and names the full key it rejects
(``regularizer.initial_lambda``, ``reward.net_kwargs.hid_sizes``).
"""

import difflib
import inspect
import math
import pathlib
from typing import Any, Dict, Iterable, List, Mapping, Optional

import gymnasium as gym
import torch as th
from imitation.rewards import reward_nets

from imitation_accum import _validation
from imitation_accum.engine import acceleration
from imitation_accum.envs import atari
from imitation_accum.planning import budget
from imitation_accum.preference import arguments

#: The keys of ``train_reward_model``'s ``regularizer`` config.
REGULARIZER_KEYS = (
    "kind",
    "initial_lambda",
    "p",
    "scaling_factor",
    "tolerable_interval",
    "val_split",
)


def check_environment(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: the environment id exists and its horizon is valid.

    Raises:
        ValueError: naming ``environment.gym_id`` (with near matches) or
            ``environment.max_episode_steps``.
    """
    del command_name, logger
    env = config["environment"]
    gym_id = env["gym_id"]
    try:
        gym.spec(gym_id)
    except (gym.error.Error, ModuleNotFoundError) as error:
        near = difflib.get_close_matches(gym_id, list(gym.registry), n=3, cutoff=0.8)
        raise ValueError(atari.unknown_id_message(gym_id, near)) from error
    _validation.optional_positive_int(
        "environment.max_episode_steps", env["max_episode_steps"]
    )
    return {}


def check_demonstrations(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: local demonstrations name a file that exists.

    Raises:
        ValueError: naming ``demonstrations.source`` or ``demonstrations.path``.
    """
    del command_name, logger
    demos = config["demonstrations"]
    sources = ("local", "huggingface", "generated")
    if demos["source"] not in sources:
        raise ValueError(
            f"demonstrations.source={demos['source']!r} must be one of {sources}"
        )
    if demos["source"] != "local":
        return {}
    path = demos["path"]
    if path is None:
        raise ValueError(
            "demonstrations.source='local' needs demonstrations.path: trajectories "
            "saved with imitation.data.serialize.save"
        )
    if not pathlib.Path(path).exists():
        raise ValueError(f"demonstrations.path={path!r}: no such file or directory")
    return {}


def check_keywords(
    key: str,
    kwargs: Mapping[str, Any],
    cls: type,
    exclude: Iterable[str] = (),
    target: Optional[str] = None,
) -> None:
    """Checks that every key of ``kwargs`` is a keyword argument of ``cls``.

    Follows ``**kwargs`` up the method resolution order to the base classes.

    Args:
        key: The config key holding ``kwargs`` (such as ``reward_trainer_kwargs``).
        kwargs: Its value.
        cls: The class that receives them.
        exclude: Arguments the experiment passes itself.
        target: What receives them, for the message (default: ``cls``'s name).

    Raises:
        ValueError: naming the first unknown key, with near matches.
    """
    accepted: List[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        accepted += [
            p.name
            for p in params
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    excluded = set(exclude)
    names = dict.fromkeys(name for name in accepted if name not in excluded)
    _validation.known_names(key, kwargs, names, target or cls.__name__)


def check_reward_trainer_kwargs(
    kwargs: Mapping[str, Any],
    trainer_cls: type,
    exclude: Iterable[str],
    logger: Any,
    optimizer_by_name: bool = False,
) -> None:
    """Checks ``reward_trainer_kwargs``: the names and values of trainer arguments.

    Args:
        kwargs: The section.
        trainer_cls: The trainer class the experiment builds.
        exclude: Arguments the experiment passes itself.
        logger: The config hook's logger.
        optimizer_by_name: ``optimizer_cls`` may be a name (:func:`optimizer_class`).

    Raises:
        ValueError: naming the first unknown or invalid
            ``reward_trainer_kwargs.<key>``.
    """
    key = "reward_trainer_kwargs"
    check_keywords(key, kwargs, trainer_cls, exclude, "CrossEntropyRewardTrainer")
    optimizer_cls = None
    if optimizer_by_name:
        optimizer_cls = optimizer_class(kwargs.get("optimizer_cls", "AdamW"))
    arguments.check_trainer_values(kwargs, f"{key}.", optimizer_cls)
    warn_budget_beyond_machine(
        logger, f"{key}.memory_budget", kwargs.get("memory_budget")
    )
    acceleration.Acceleration.parse(kwargs.get("acceleration"), f"{key}.acceleration")


def check_counts(config: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Checks that the top-level ``keys`` in ``config`` are positive whole numbers."""
    for key in keys:
        if key in config:
            _validation.positive_count(key, config[key])


def check_regularizer(section: Mapping[str, Any]) -> None:
    """Checks ``train_reward_model``'s ``regularizer`` config, naming the bad key."""
    _validation.known_names(
        "regularizer", section, REGULARIZER_KEYS, "the regularizer config"
    )
    kind = section.get("kind")
    if kind not in (None, "lp", "weight_decay"):
        raise ValueError(
            f"regularizer.kind={kind!r} must be None, 'lp' or 'weight_decay'"
        )
    _validation.finite_float(
        "regularizer.initial_lambda", section.get("initial_lambda"), allow_zero=True
    )
    _validation.positive_finite_float("regularizer.p", section.get("p"))
    if kind is None:
        return
    factor = section.get("scaling_factor")
    if factor is None:
        return
    _validation.positive_finite_float("regularizer.scaling_factor", factor)
    if not factor < 1:
        raise ValueError(f"regularizer.scaling_factor={factor!r} must lie in (0, 1)")
    interval = section.get("tolerable_interval")
    if (
        not isinstance(interval, (list, tuple))
        or len(interval) != 2
        or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in interval)
        or not 0 <= interval[0] < interval[1]
    ):
        raise ValueError(
            f"regularizer.tolerable_interval={interval!r} must be a pair (low, "
            "high) with 0 <= low < high"
        )
    val_split = _validation.positive_finite_float(
        "regularizer.val_split", section.get("val_split")
    )
    if not val_split < 1:
        raise ValueError(f"regularizer.val_split={val_split!r} must lie in (0, 1)")


def check_reward_ingredient(config: Mapping[str, Any], command_name: str) -> None:
    """Checks imitation's ``reward`` ingredient: net class and sizes."""
    reward = config.get("reward")
    if not isinstance(reward, Mapping):
        return
    specific = reward.get("algorithm_specific", {}).get(command_name, {})
    net_cls = specific.get("net_cls", reward.get("net_cls"))
    if not (isinstance(net_cls, type) and issubclass(net_cls, reward_nets.RewardNet)):
        raise ValueError(
            f"reward.net_cls={getattr(net_cls, '__name__', net_cls)!r} is not an "
            "imitation RewardNet class (such as BasicRewardNet or CnnRewardNet); "
            "a class cannot be named on the command line: set it in a named "
            "config or a config file"
        )
    net_kwargs: Dict[str, Any] = {
        **reward.get("net_kwargs", {}),
        **specific.get("net_kwargs", {}),
    }
    hid_sizes = net_kwargs.get("hid_sizes")
    if hid_sizes is not None:
        if not isinstance(hid_sizes, (list, tuple)):
            raise ValueError(
                f"reward.net_kwargs.hid_sizes={hid_sizes!r} must be a list of "
                "positive ints"
            )
        for size in hid_sizes:
            _validation.positive_int("reward.net_kwargs.hid_sizes[...]", size)
    ensemble_size = reward.get("ensemble_size")
    if ensemble_size is not None:
        _validation.positive_int("reward.ensemble_size", ensemble_size)


def warn_budget_beyond_machine(logger: Any, key: str, value: object) -> None:
    """Warns if the memory budget ``value`` of ``key`` exceeds this machine's memory.

    Only a warning: a config may be meant for a larger machine; the trainer
    refuses such a budget for its device.
    """
    message = budget.beyond_memory(
        budget.parse_budget(value, key), budget.machine_bytes(), "this machine", key
    )
    if message is not None:
        logger.warning(f"{message}; training here will refuse it")


def check_preference_model_kwargs(kwargs: Any) -> None:
    """``preference_model_kwargs``: a dict of ``PreferenceModel`` arguments in range."""
    if not isinstance(kwargs, Mapping):
        raise ValueError(
            f"preference_model_kwargs={kwargs!r} must be a dict of PreferenceModel "
            "arguments (noise_prob, discount_factor, threshold)"
        )
    arguments.check_preference_model_values(kwargs, "preference_model_kwargs.")


def check_device(value: Any) -> None:
    """``device``: ``"auto"`` or anything ``torch.device`` accepts."""
    if value == "auto":
        return
    try:
        th.device(value)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device={value!r} is not a device: give 'auto', 'cpu', 'cuda' or 'cuda:N'"
        ) from error


def optimizer_class(value: Any) -> type:
    """``reward_trainer_kwargs.optimizer_cls``: a torch optimizer class, or its name."""
    if isinstance(value, str):
        cls = getattr(th.optim, value, None)
        if not (isinstance(cls, type) and issubclass(cls, th.optim.Optimizer)):
            raise ValueError(
                f"reward_trainer_kwargs.optimizer_cls={value!r} is not an optimizer "
                "of torch.optim"
            )
        return cls
    if isinstance(value, type) and issubclass(value, th.optim.Optimizer):
        return value
    raise ValueError(
        f"reward_trainer_kwargs.optimizer_cls={value!r} must be a torch.optim "
        "optimizer class or its name"
    )
