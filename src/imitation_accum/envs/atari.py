"""Fixed-horizon, score-masked Atari environments for reward learning.

imitation rejects episodes of varying length, and a visible score leaks the reward;
seals fixes both, but registers none of its ids with ale-py 0.9.1. Importing this
module registers, for every ale-py ``<Game>NoFrameskip-v4``:

- ``seals/<Game>NoFrameskip-v4`` (games with a known score region) and
  ``seals/<Game>NoFrameskip-Unmasked-v4``: seals' environments, raw 210x160x3 frames;
- ``imitation_accum/<Game>NoFrameskip-v4`` and ``...-Unmasked-v4``: the same under
  SB3's standard Atari preprocessing (see :func:`make_atari_env`), uint8
  observations of shape ``(84, 84, 4)`` (the layout ``CnnRewardNet`` reads).

Episodes never end on their own: ``environment.max_episode_steps`` (a ``TimeLimit``)
fixes their length, ``DEFAULT_HORIZON`` agent steps by default.
"""

import re
from typing import Any, Dict, List, Optional, Sequence, SupportsFloat, Tuple

import ale_py  # noqa: F401  (registers the ALE ids with gymnasium)
import gymnasium as gym
import numpy as np
import seals.atari
from gymnasium import spaces
from stable_baselines3.common import atari_wrappers
from stable_baselines3.common.vec_env.stacked_observations import StackedObservations

NAMESPACE = "imitation_accum"
DEFAULT_HORIZON = 1000  # agent steps (4,000 frames, about a minute of play)
_ALE_ID = re.compile(r"^(?P<game>[A-Za-z]+)NoFrameskip-v4$")


def masked_games() -> List[str]:
    """Games whose score region seals knows (ALE names such as ``"Pong"``), sorted."""
    return sorted(seals.atari.SCORE_REGIONS)


def ale_games() -> List[str]:
    """Every game ale-py registers a ``<Game>NoFrameskip-v4`` id for, sorted."""
    games = (_ALE_ID.match(env_id) for env_id in gym.registry)
    return sorted(m.group("game") for m in games if m is not None)


def env_id(game: str, *, masked: bool = True) -> str:
    """``imitation_accum/<game>NoFrameskip-v4`` (``-Unmasked-v4`` unless ``masked``)."""
    return f"{NAMESPACE}/{game}NoFrameskip{'' if masked else '-Unmasked'}-v4"


def game_of(gym_id: str) -> Optional[str]:
    """The game behind an Atari ``gym_id`` of this module, seals or ale-py (or None)."""
    name = gym_id.split(":")[-1].split("/")[-1].replace("-Unmasked", "")
    match = _ALE_ID.match(name)
    return match.group("game") if match else None


class FrameStack(gym.ObservationWrapper):
    """SB3's ``VecFrameStack`` for one environment: the last ``n_stack`` frames.

    Stacked on the channel (last) axis; cleared only on ``reset``.

    Args:
        env: An environment with channel-last image observations.
        n_stack: Number of frames to stack.

    Raises:
        TypeError: if the observation space is not a ``Box``.
    """

    def __init__(self, env: gym.Env, n_stack: int) -> None:
        super().__init__(env)
        if not isinstance(env.observation_space, spaces.Box):
            raise TypeError("FrameStack needs a Box observation space")
        self._stack = StackedObservations(1, n_stack, env.observation_space, "last")
        self.observation_space = self._stack.stacked_observation_space

    def reset(self, **kwargs: Any) -> Tuple[np.ndarray, Dict[str, Any]]:
        """Clears the stack and pushes the first frame."""
        obs, info = self.env.reset(**kwargs)
        return self._stack.reset(obs[None])[0].copy(), info

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Pushes ``observation`` and returns the stack (a new array)."""
        stacked, _ = self._stack.update(observation[None], np.zeros(1, bool), [{}])
        return stacked[0]


class _NoTermination(gym.Wrapper):
    # Checks that the inner environment never ends an episode on its own.

    def step(self, action: Any) -> Tuple[Any, SupportsFloat, bool, bool, dict]:
        obs, rew, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            raise RuntimeError("an episode ended inside the auto-reset wrapper")
        return obs, rew, terminated, truncated, info


def make_atari_env(
    game_id: str,
    *,
    masked: bool,
    frame_skip: int = 4,
    screen_size: int = 84,
    frame_stack: int = 4,
    noop_max: int = 30,
    clip_reward: bool = False,
    **ale_kwargs: Any,
) -> gym.Env:
    """The Atari environment: seals' (auto-reset at game over), AtariWrapper, a stack.

    Args:
        game_id: An ale-py ``<Game>NoFrameskip-v4`` id.
        masked: Black out the score (seals' region for the game).
        frame_skip: Repeat each action this many frames (max-pooling the last two).
        screen_size: Side of the square grayscale frame.
        frame_stack: Frames stacked on the channel axis.
        noop_max: At most this many no-ops after a reset.
        clip_reward: Clip rewards to their sign (the ground truth stays unclipped).
        ale_kwargs: Passed to ``gym.make`` of the ALE environment.

    Returns:
        uint8 observations of shape ``(screen_size, screen_size, frame_stack)``.

    Raises:
        ValueError: if ``masked`` and seals knows no score region for the game.
    """
    if masked and game_of(game_id) not in seals.atari.SCORE_REGIONS:
        raise ValueError(
            f"the score region of {game_id} is unknown; known: {masked_games()}"
        )
    env = seals.atari.make_atari_env(game_id, masked, **ale_kwargs)
    env = _NoTermination(env)
    env = atari_wrappers.AtariWrapper(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        terminal_on_life_loss=False,  # a lost life must not end the episode
        clip_reward=clip_reward,
    )
    return FrameStack(env, frame_stack) if frame_stack > 1 else env


def register_envs() -> None:
    """Registers the ids described in this module's docstring (idempotent)."""
    games = ale_games()
    missing_seals = [
        gym.spec(f"{game}NoFrameskip-v4")
        for game in games
        if f"seals/{game}NoFrameskip-Unmasked-v4" not in gym.registry
    ]
    # seals registers these itself where its ale-py filter matches; here only the
    # ids it could not register, with its own function.
    seals.atari.register_atari_envs(missing_seals)
    for game in games:
        for masked in (True, False) if game in seals.atari.SCORE_REGIONS else (False,):
            if env_id(game, masked=masked) in gym.registry:
                continue
            gym.register(
                id=env_id(game, masked=masked),
                entry_point=f"{__name__}:make_atari_env",
                max_episode_steps=DEFAULT_HORIZON,
                kwargs=dict(game_id=f"{game}NoFrameskip-v4", masked=masked),
            )


def unknown_id_message(gym_id: str, suggestions: Sequence[str]) -> str:
    """The message for an unregistered ``gym_id``, with near matches and Atari ids."""
    hint = f"; did you mean {' or '.join(repr(s) for s in suggestions)}?"
    return (
        f"environment.gym_id={gym_id!r} is not a registered environment"
        + (hint if suggestions else "")
        + f". Atari: {env_id('<Game>')} for <Game> in {', '.join(masked_games())}; "
        f"{env_id('<Game>', masked=False)} for <Game> in {', '.join(ale_games())}"
    )


register_envs()
