"""Reward-net inputs from raw transitions already on the device.

Nets with imitation's stock ``preprocess`` get SB3's conversion, chosen once per
space, and no next observations if they never read them; others their own.
"""

from typing import Callable, Optional, Tuple, cast

import gymnasium as gym
import torch as th
from imitation.rewards import reward_nets
from stable_baselines3.common import preprocessing
from torch import nn
from torch.nn import functional as F  # noqa: N812

NetInputs = Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]


def _stock_preprocess_owner(net: nn.Module) -> Optional[reward_nets.RewardNet]:
    # The net whose unmodified RewardNet.preprocess net.preprocess runs, or None if
    # some class on the way (through imitation's wrappers) overrides preprocess.
    while isinstance(net, reward_nets.RewardNet):
        method = type(net).preprocess
        if method is reward_nets.RewardNet.preprocess:
            return net
        if method is not reward_nets.RewardNetWrapper.preprocess:
            return None
        net = cast(reward_nets.RewardNetWrapper, net).base
    return None


def reads_next_state(net: nn.Module) -> bool:
    """Whether a net's forward (through imitation's wrappers) reads ``next_state``.

    ``False`` only for imitation's ``BasicRewardNet`` and ``CnnRewardNet`` (not
    subclasses that change ``forward``) built with ``use_next_state=False``.
    """
    while (
        isinstance(net, reward_nets.PredictProcessedWrapper)
        and type(net).forward is reward_nets.PredictProcessedWrapper.forward
    ):
        net = net.base
    for cls in (reward_nets.BasicRewardNet, reward_nets.CnnRewardNet):
        if isinstance(net, cls) and type(net).forward is cls.forward:
            return bool(net.use_next_state)
    return True


def _converter(
    space: gym.Space,
    normalize_images: bool,
) -> Callable[[th.Tensor], th.Tensor]:
    # SB3's preprocess_obs for one space, with its checks made once (the space
    # checks cost more than the conversion on small calls): its Box and Discrete
    # cases copied, a few upstream lines.
    if isinstance(space, gym.spaces.Box):
        if normalize_images and preprocessing.is_image_space(space):
            return lambda x: x.float() / 255.0
        return lambda x: x.float()
    if isinstance(space, gym.spaces.Discrete):
        n = int(space.n)
        return lambda x: F.one_hot(x.long(), num_classes=n).float()

    def convert(x: th.Tensor) -> th.Tensor:
        out = preprocessing.preprocess_obs(x, space, normalize_images)
        if not isinstance(out, th.Tensor):
            raise ValueError("dictionary observations are not supported")
        return out

    return convert


class InputPreparer:
    """Turns raw transition tensors into a reward net's ``forward`` arguments.

    Args:
        net: The reward net whose ``preprocess`` defines the conversion.
        forward_net: The net whose ``forward`` is called, if not ``net`` (for
            AIRL, the shaped net around the base reward).
    """

    def __init__(
        self,
        net: reward_nets.RewardNet,
        forward_net: Optional[nn.Module] = None,
    ) -> None:
        self.net = net
        self._stock_net = _stock_preprocess_owner(net)
        self.uses_stock_preprocess = self._stock_net is not None
        """Whether the net runs imitation's ``RewardNet.preprocess``, which
        converts each transition on its own (unlike a net's own, perhaps)."""
        self.reads_next_state = self._stock_net is None or reads_next_state(
            net if forward_net is None else forward_net,
        )
        if self._stock_net is not None:
            normalize = self._stock_net.normalize_images
            self._convert_obs = _converter(self._stock_net.observation_space, normalize)
            self._convert_acts = _converter(self._stock_net.action_space, normalize)

    def __call__(
        self,
        obs: th.Tensor,
        acts: th.Tensor,
        next_obs: Optional[th.Tensor],
        dones: th.Tensor,
    ) -> NetInputs:
        """The ``forward`` arguments ``(state, action, next_state, done)``.

        ``obs`` come as stored (uint8 frames until here); ``next_obs`` may be
        ``None`` when :attr:`reads_next_state` is false (``state`` stands in).
        """
        if self._stock_net is None:
            return self.net.preprocess(obs, acts, next_obs, dones)  # type: ignore[arg-type]
        state = self._convert_obs(obs)
        if self.reads_next_state:
            assert next_obs is not None
            next_state = self._convert_obs(next_obs)
        else:
            next_state = state
        return state, self._convert_acts(acts), next_state, dones.to(th.float32)
