"""Fixed-horizon, score-masked, preprocessed Atari environments."""

import gymnasium as gym
import numpy as np
import pytest
from imitation.rewards.reward_nets import CnnRewardNet
from imitation.util import util
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecTransposeImage

from imitation_accum.envs import atari

PONG = atari.env_id("Pong")
PONG_UNMASKED = atari.env_id("Pong", masked=False)


def test_ids_registered():
    assert set(atari.masked_games()) <= set(atari.ale_games())
    assert "Pong" in atari.masked_games() and len(atari.masked_games()) >= 4
    for game in atari.ale_games():
        assert atari.env_id(game, masked=False) in gym.registry
        masked = atari.env_id(game) in gym.registry
        assert masked == (game in atari.masked_games())
        assert f"seals/{game}NoFrameskip-Unmasked-v4" in gym.registry
    assert "seals/PongNoFrameskip-v4" in gym.registry
    atari.register_envs()  # idempotent


def test_observations_are_stacked_uint8_frames():
    env = gym.make(PONG)
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (84, 84, 4)
    previous = obs
    for _ in range(5):
        obs, *_ = env.step(env.action_space.sample())
        # The newest frame is last; the others move one place towards the front.
        np.testing.assert_array_equal(obs[..., :3], previous[..., 1:])
        previous = obs
    env.close()


@pytest.mark.parametrize(
    ("gym_id", "horizon"),
    [(PONG, 1200), ("seals/PongNoFrameskip-v4", 5000)],
)
def test_fixed_horizon_hides_game_over(gym_id, horizon):
    # A random agent loses a game of Pong in about 4,400 frames (1,100 agent steps
    # of 4 frames); the episode goes on to the horizon all the same.
    env = gym.make(gym_id, max_episode_steps=horizon)
    env.reset(seed=0)
    env.action_space.seed(0)
    games_over, frame, steps, truncated = 0, 0, 0, False
    while not truncated:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
        assert not terminated
        games_over += info["episode_frame_number"] < frame  # ALE's game restarted
        frame = info["episode_frame_number"]
    assert steps == horizon
    assert games_over == 1
    env.close()


def test_score_is_masked():
    # Pong's score sits in the top 24 of 210 rows: the top 9 of 84.
    masked, unmasked = gym.make(PONG), gym.make(PONG_UNMASKED)
    obs_m, _ = masked.reset(seed=0)
    obs_u, _ = unmasked.reset(seed=0)
    assert not obs_m[:9].any()
    assert obs_u[:9].any()  # the digits "0 0"
    np.testing.assert_array_equal(obs_m[12:], obs_u[12:])
    raw, _ = gym.make("seals/PongNoFrameskip-v4").reset(seed=0)
    assert raw.shape == (210, 160, 3) and not raw[:24].any() and raw[24:].any()


def test_reward_net_and_cnn_policy_share_the_frames():
    venv = util.make_vec_env(PONG, rng=np.random.default_rng(0), n_envs=2)
    net = CnnRewardNet(venv.observation_space, venv.action_space)
    no_qr = {"ortho_init": False}  # orthogonal init of CNN weights is slow
    agent = PPO("CnnPolicy", venv, n_steps=8, batch_size=8, policy_kwargs=no_qr)
    # SB3 moves channels first for its policy only; the reward net reads the
    # environment's own height-width-channel frames.
    assert isinstance(agent.get_env(), VecTransposeImage)
    assert agent.observation_space.shape == (4, 84, 84)
    obs = venv.reset()
    acts = np.array([agent.predict(obs)[0]]).reshape(-1)
    rewards = net.predict(obs, acts, obs, np.zeros(2, bool))
    assert rewards.shape == (2,) and np.isfinite(rewards).all()
    venv.close()


def test_unknown_id_message_lists_games():
    message = atari.unknown_id_message("imitation_accum/Pacman-v4", [])
    assert "Pong" in message and "Asteroids" in message
    assert atari.game_of("seals/PongNoFrameskip-Unmasked-v4") == "Pong"
    assert atari.game_of("CartPole-v1") is None
