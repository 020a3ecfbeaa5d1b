"""Reward-net inputs from raw transitions already on the device.

imitation's ``RewardNet.preprocess`` converts observations, actions, next
observations and dones for the net's ``forward``. :class:`InputPreparer` does the
same, but for nets that keep imitation's ``preprocess`` it converts each field
with SB3's conversion chosen once per space (the space checks cost more than the
conversion on small calls), and it skips next observations for imitation's
``BasicRewardNet``/``CnnRewardNet`` built without ``use_next_state`` (their
default), which never read them: half of the frames need not be gathered, moved
or converted. Any other net gets its own ``preprocess`` and every field.
"""

from typing import Callable, Optional, Tuple, cast

import gymnasium as gym
import torch as th
from imitation.rewards import reward_nets
from stable_baselines3.common import preprocessing
from torch import nn
from torch.nn import functional as F  # noqa: N812

NetInputs = Tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]


def stock_preprocess_owner(net: nn.Module) -> Optional[reward_nets.RewardNet]:
    """The net whose unmodified ``RewardNet.preprocess`` ``net.preprocess`` runs.

    Args:
        net: A reward net, possibly inside imitation's wrappers.

    Returns:
        That net, or ``None`` if some class on the way overrides ``preprocess``.
    """
    while isinstance(net, reward_nets.RewardNet):
        method = type(net).preprocess
        if method is reward_nets.RewardNet.preprocess:
            return net
        if method is not reward_nets.RewardNetWrapper.preprocess:
            return None
        net = cast(reward_nets.RewardNetWrapper, net).base
    return None


def reads_next_state(net: nn.Module) -> bool:
    """Whether a reward net's forward reads its ``next_state`` argument.

    Args:
        net: The net whose forward is called (through imitation's
            output-normalizing wrappers, which forward to their base).

    Returns:
        ``False`` only for imitation's ``BasicRewardNet`` and ``CnnRewardNet``
        (not subclasses that change ``forward``) built with
        ``use_next_state=False``; any other net is assumed to read it.
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


def converter(
    space: gym.Space,
    normalize_images: bool,
) -> Callable[[th.Tensor], th.Tensor]:
    """SB3's ``preprocess_obs`` for one space, with its checks made once.

    Args:
        space: The observation or action space.
        normalize_images: Whether image observations are divided by 255.

    Returns:
        A function converting a batch from ``space`` to the net's input.
    """
    # The Box and Discrete cases of SB3's preprocess_obs (a few upstream lines).
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
        self._stock_net = stock_preprocess_owner(net)
        self.reads_next_state = self._stock_net is None or reads_next_state(
            net if forward_net is None else forward_net,
        )
        if self._stock_net is not None:
            normalize = self._stock_net.normalize_images
            self._convert_obs = converter(self._stock_net.observation_space, normalize)
            self._convert_acts = converter(self._stock_net.action_space, normalize)

    @property
    def uses_stock_preprocess(self) -> bool:
        """Whether the net runs imitation's stock ``RewardNet.preprocess``.

        That conversion treats each transition on its own, so converting a slice
        of transitions equals slicing their conversion; a net's own
        ``preprocess`` promises no such thing.
        """
        return self._stock_net is not None

    def __call__(
        self,
        obs: th.Tensor,
        acts: th.Tensor,
        next_obs: Optional[th.Tensor],
        dones: th.Tensor,
    ) -> NetInputs:
        """The ``forward`` arguments ``(state, action, next_state, done)``.

        Args:
            obs: Observations, as stored (uint8 frames stay uint8 until here).
            acts: Actions.
            next_obs: Next observations; may be ``None`` when
                :attr:`reads_next_state` is false (``state`` then stands in).
            dones: Episode-end flags.

        Returns:
            The converted tensors.
        """
        if self._stock_net is None:
            return self.net.preprocess(
                obs,  # type: ignore[arg-type]
                acts,  # type: ignore[arg-type]
                next_obs,  # type: ignore[arg-type]
                dones,  # type: ignore[arg-type]
            )
        state = self._convert_obs(obs)
        if self.reads_next_state:
            assert next_obs is not None
            next_state = self._convert_obs(next_obs)
        else:
            next_state = state
        return state, self._convert_acts(acts), next_state, dones.to(th.float32)
