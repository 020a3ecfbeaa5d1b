"""``imitation_accum.atari``: kept at this path for ``module:id`` environment ids.

Importing it registers the ``imitation_accum/<Game>NoFrameskip-v4`` ids; the code
lives in :mod:`imitation_accum.envs.atari`.
"""

from imitation_accum.envs.atari import (
    FrameStack,
    ale_games,
    env_id,
    make_atari_env,
    masked_games,
    register_envs,
)

__all__ = [
    "FrameStack",
    "ale_games",
    "env_id",
    "make_atari_env",
    "masked_games",
    "register_envs",
]
