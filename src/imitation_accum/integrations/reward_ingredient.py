"""imitation's reward ingredient, made to build CNN reward nets (used by ``patch``).

The reward ingredient always gives its net a ``normalize_input_layer``, which CNN
reward nets reject: :func:`add_reward_config_hook` and :func:`reward_net_builder`
leave it out for them.
"""

import functools
from typing import Any, Callable, Dict, Mapping, Tuple, Type

from imitation.rewards import reward_nets

from imitation_accum.nets import shaped as accum_reward_nets

_NORM_KEY = "reward.net_kwargs.normalize_input_layer"


def image_reward_nets() -> Tuple[Type[reward_nets.RewardNet], ...]:
    """Reward net classes that read images and take no input normalization layer.

    Returns:
        ``CnnRewardNet`` and this package's CNN shaped reward net.
    """
    return (reward_nets.CnnRewardNet, accum_reward_nets.CnnShapedRewardNet)


def is_image_reward_net(net_cls: object) -> bool:
    """Whether ``net_cls`` is a CNN reward net class (see :func:`image_reward_nets`).

    Args:
        net_cls: Anything; typically ``reward.net_cls``.

    Returns:
        ``True`` for subclasses of the classes of :func:`image_reward_nets`.
    """
    return isinstance(net_cls, type) and issubclass(net_cls, image_reward_nets())


def _no_input_norm(net_cls: type, layer: object) -> None:
    if layer is not None:
        raise ValueError(
            f"{_NORM_KEY}={getattr(layer, '__name__', layer)!r}: {net_cls.__name__} "
            "reads images and has no input normalization; set it to None",
        )


def reward_net_builder(make_reward_net: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps the reward ingredient's ``_make_reward_net`` to build CNN reward nets.

    Args:
        make_reward_net: imitation's ``reward._make_reward_net(venv, net_cls,
            net_kwargs, normalize_output_layer)``.

    Returns:
        The same function, except that for a CNN reward net a
        ``normalize_input_layer=None`` is left out of the net's arguments.
    """

    @functools.wraps(make_reward_net)
    def build(
        venv: Any,
        net_cls: type,
        net_kwargs: Mapping[str, Any],
        normalize_output_layer: Any,
    ) -> Any:
        if is_image_reward_net(net_cls):
            net_kwargs = dict(net_kwargs)
            _no_input_norm(net_cls, net_kwargs.pop("normalize_input_layer", None))
        return make_reward_net(venv, net_cls, net_kwargs, normalize_output_layer)

    return build


def _reward_config_hook(
    config: Dict[str, Any],
    command_name: str,
    logger: Any,
) -> Dict[str, Any]:
    """For CNN reward nets: ``normalize_input_layer=None``, not imitation's default."""
    del logger
    reward = config["reward"]
    specific = reward.get("algorithm_specific", {}).get(command_name, {})
    net_cls = specific.get("net_cls", reward["net_cls"])
    if not is_image_reward_net(net_cls):
        return {}
    net_kwargs = {**reward["net_kwargs"], **specific.get("net_kwargs", {})}
    _no_input_norm(net_cls, net_kwargs.get("normalize_input_layer"))
    return {"net_kwargs": {"normalize_input_layer": None}}


def add_reward_config_hook() -> Callable[[], None]:
    """Adds the CNN reward net hook to imitation's reward ingredient.

    imitation's own hook adds ``normalize_input_layer=RunningNorm`` to every net's
    arguments unless the config names one; this hook (which runs after it) sets it
    to ``None`` for CNN reward nets and rejects a configured layer.

    Returns:
        A function that removes the hook again.
    """
    from imitation.scripts.ingredients import reward

    hooks = reward.reward_ingredient.config_hooks
    hooks.append(_reward_config_hook)
    return lambda: hooks.remove(_reward_config_hook)
