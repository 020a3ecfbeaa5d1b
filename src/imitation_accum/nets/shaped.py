"""Reward nets imitation has the parts for but does not assemble."""

from typing import Any, Sequence

import gymnasium as gym
from imitation.rewards import reward_nets


class CnnShapedRewardNet(reward_nets.ShapedRewardNet):
    """A potential-shaped CNN reward net, for AIRL on image observations.

    imitation's ``CnnRewardNet`` (base reward) and ``BasicPotentialCNN`` (potential)
    inside its ``ShapedRewardNet``: the CNN counterpart of ``BasicShapedRewardNet``.

    Args:
        observation_space: The (image) observation space.
        action_space: The action space (``Discrete`` if ``use_action``).
        reward_hid_channels: Channels of the base CNN's hidden layers.
        potential_hid_channels: Channels of the potential CNN's hidden layers.
        use_state: Whether the base reward reads the current frame.
        use_action: Whether the base reward reads the action.
        use_next_state: Whether the base reward reads the next frame.
        use_done: Whether the base reward reads the done flag.
        hwc_format: Whether frames are (height, width, channels), the
            environment's own layout, for both CNNs; else channels-first.
        discount_factor: Discount factor of the potential shaping.
        **kwargs: Passed to imitation's ``build_cnn`` for both CNNs.

    Raises:
        ValueError: if the observations are not images, or ``use_action`` is set
            with a non-``Discrete`` action space.

    Example:
        >>> net = CnnShapedRewardNet(  # doctest: +SKIP
        ...     venv.observation_space, venv.action_space, discount_factor=0.99
        ... )
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        reward_hid_channels: Sequence[int] = (32, 32),
        potential_hid_channels: Sequence[int] = (32, 32),
        use_state: bool = True,
        use_action: bool = True,
        use_next_state: bool = False,
        use_done: bool = False,
        hwc_format: bool = True,
        discount_factor: float = 0.99,
        **kwargs: Any,
    ) -> None:
        base = reward_nets.CnnRewardNet(
            observation_space,
            action_space,
            use_state=use_state,
            use_action=use_action,
            use_next_state=use_next_state,
            use_done=use_done,
            hwc_format=hwc_format,
            hid_channels=tuple(reward_hid_channels),
            **kwargs,
        )
        potential = reward_nets.BasicPotentialCNN(
            observation_space,
            hid_sizes=tuple(potential_hid_channels),
            hwc_format=hwc_format,
            **kwargs,
        )
        super().__init__(base, potential, discount_factor=discount_factor)
