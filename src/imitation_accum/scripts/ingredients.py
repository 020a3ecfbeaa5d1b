"""Fixes and checks for imitation's sacred ingredients.

- The reward ingredient's fix for CNN reward nets lives in
  :mod:`imitation_accum.integrations.reward_ingredient` (``patch`` installs it
  without importing the scripts); its names are re-exported here.
- Config checks that run before anything is built (sacred config hooks of this
  package's experiments): the environment id, local demonstrations, and the
  keyword arguments meant for a trainer.
"""

import difflib
import inspect
import pathlib
from typing import Any, Callable, Dict, Iterable, Mapping

import gymnasium as gym
import sacred

from imitation_accum import _validation
from imitation_accum.envs import atari
from imitation_accum.integrations.reward_ingredient import (  # noqa: F401
    add_reward_config_hook,
    image_reward_nets,
    is_image_reward_net,
    reward_net_builder,
)

ConfigHook = Callable[[Dict[str, Any], str, Any], Dict[str, Any]]


def check_environment(
    config: Dict[str, Any],
    command_name: str,
    logger: Any,
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
        "environment.max_episode_steps",
        env["max_episode_steps"],
    )
    return {}


def check_demonstrations(
    config: Dict[str, Any],
    command_name: str,
    logger: Any,
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
            f"demonstrations.source={demos['source']!r} must be one of {sources}",
        )
    if demos["source"] != "local":
        return {}
    path = demos["path"]
    if path is None:
        raise ValueError(
            "demonstrations.source='local' needs demonstrations.path: trajectories "
            "saved with imitation.data.serialize.save",
        )
    if not pathlib.Path(path).exists():
        raise ValueError(f"demonstrations.path={path!r}: no such file or directory")
    return {}


def accepted_keywords(cls: type, exclude: Iterable[str] = ()) -> Dict[str, Any]:
    """The keyword arguments ``cls(...)`` accepts, with their defaults.

    Follows ``**kwargs`` up the method resolution order, as a constructor that
    passes them on to its base class does.

    Args:
        cls: The class.
        exclude: Names to leave out (those the caller passes itself).

    Returns:
        Argument name to default (``inspect.Parameter.empty`` if required).
    """
    accepted: Dict[str, Any] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        for p in params:
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                accepted.setdefault(p.name, p.default)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return {k: v for k, v in accepted.items() if k not in set(exclude)}


def check_keywords(
    key: str,
    kwargs: Mapping[str, Any],
    accepted: Mapping[str, Any],
    target: str,
) -> None:
    """Checks that every key of ``kwargs`` is an argument of ``target``.

    Args:
        key: The config key holding ``kwargs`` (such as ``reward_trainer_kwargs``).
        kwargs: Its value.
        accepted: The accepted names (see :func:`accepted_keywords`).
        target: What receives them, for the message.

    Raises:
        ValueError: naming the first unknown key, with near matches.
    """
    _validation.known_names(key, kwargs, accepted, target)


def add_hooks(experiment: sacred.Ingredient, hooks: Iterable[ConfigHook]) -> None:
    """Registers config hooks on ``experiment``.

    Args:
        experiment: A sacred experiment or ingredient.
        hooks: Functions ``(config, command_name, logger) -> updates``.
    """
    for hook in hooks:
        experiment.config_hook(hook)
