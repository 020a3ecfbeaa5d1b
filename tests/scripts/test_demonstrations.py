"""Local demonstrations: made by a command, loaded with their dtypes."""

import numpy as np
from imitation.data import serialize

import imitation_accum
from imitation_accum.integrations import demonstrations


def test_make_and_load_keeps_uint8_frames(tmp_path, capsys):
    path = tmp_path / "demos"
    demonstrations.main(
        [
            "--gym-id",
            "imitation_accum/PongNoFrameskip-v4",
            "--out",
            str(path),
            "--episodes",
            "2",
            "--max-episode-steps",
            "7",
        ],
    )
    assert "Saved 2 episodes (14 transitions)" in capsys.readouterr().out
    assert serialize.load(path)[0].obs.dtype == np.int64  # imitation's loader
    with imitation_accum.patched():
        loaded = serialize.load(path)
    assert len(loaded) == 2
    for traj in [*loaded, loaded[-1], *loaded[0:1]]:
        assert traj.obs.dtype == np.uint8 and traj.obs.shape == (8, 84, 84, 4)
        assert len(traj.acts) == len(traj.rews) == len(traj.infos) == 7
        assert traj.rews.dtype == np.float32 and traj.terminal
    unpatched = serialize.load(path)
    np.testing.assert_array_equal(loaded[1].obs, unpatched[1].obs)
    np.testing.assert_array_equal(loaded[1].acts, unpatched[1].acts)
    np.testing.assert_array_equal(loaded[1].rews, unpatched[1].rews)


def test_load_with_rewards_of_vector_observations(tmp_path):
    trajs = demonstrations.make_demonstrations(
        tmp_path / "demos",
        gym_id="Pendulum-v1",
        n_episodes=3,
        max_episode_steps=4,
    )
    with imitation_accum.patched():
        loaded = serialize.load_with_rewards(tmp_path / "demos")
    assert len(loaded) == len(trajs) >= 3
    for saved, back in zip(trajs, loaded):
        np.testing.assert_array_equal(saved.obs, back.obs)
        assert back.obs.dtype == saved.obs.dtype == np.float32
        np.testing.assert_array_equal(saved.acts, back.acts)


def test_demonstrations_of_a_saved_cnn_policy(tmp_path):
    from imitation.util import util
    from stable_baselines3 import PPO

    gym_id = "imitation_accum/BreakoutNoFrameskip-v4"
    venv = util.make_vec_env(gym_id, rng=np.random.default_rng(0), n_envs=1)
    PPO(
        "CnnPolicy", venv, n_steps=8, batch_size=8, policy_kwargs={"ortho_init": False}
    ).save(tmp_path / "agent" / "model")
    venv.close()
    trajs = demonstrations.make_demonstrations(
        tmp_path / "demos",
        gym_id=gym_id,
        n_episodes=1,
        policy_type="ppo",
        policy_path=str(tmp_path / "agent"),
        max_episode_steps=6,
    )
    assert [len(t) for t in trajs] == [6]
    assert trajs[0].obs.shape == (7, 84, 84, 4) and trajs[0].obs.dtype == np.uint8
