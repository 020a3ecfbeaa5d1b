"""Config checks of the experiments' sacred hooks, naming the full key they reject."""

import difflib
import inspect
import pathlib
from typing import Any, Dict, Iterable, List, Mapping, Optional

import gymnasium as gym
from imitation.rewards import reward_nets

from imitation_accum import _validation
from imitation_accum.engine import acceleration
from imitation_accum.envs import atari
from imitation_accum.planning import budget
from imitation_accum.preference import arguments


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
    """Checks that config ``key``'s ``kwargs`` are keyword arguments of ``cls``.

    Follows ``**kwargs`` up the method resolution order, less ``exclude`` (what the
    experiment passes itself); ``target`` names the receiver (default: ``cls``).

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
    optimizer_cls: Optional[type] = None,
) -> None:
    """Checks ``reward_trainer_kwargs``: the names and values of trainer arguments.

    ``trainer_cls`` receives them, less ``exclude``; ``logger`` is the hook's;
    ``optimizer_cls`` (if given) is checked against ``optimizer_kwargs``.

    Raises:
        ValueError: naming the first unknown or invalid
            ``reward_trainer_kwargs.<key>``.
    """
    key = "reward_trainer_kwargs"
    check_keywords(key, kwargs, trainer_cls, exclude, "CrossEntropyRewardTrainer")
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

    Only a warning: a config may be meant for a larger machine.
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
