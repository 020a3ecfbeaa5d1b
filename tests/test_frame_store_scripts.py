"""The convert command and ``train_reward_model`` on frame stores and pickles."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import seals  # noqa: F401  (registers seals/CartPole-v0, the default environment)
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import rollout
from imitation.util import util

from imitation_accum import PreferenceDataset, checkpoint
from imitation_accum.scripts import convert_preferences
from imitation_accum.scripts.train_reward_model import train_reward_model_ex as ex
from tests.test_frame_store import assert_same_pairs, make_pairs, preferences_of


@pytest.fixture(scope="module")
def cartpole_pickle(tmp_path_factory) -> pathlib.Path:
    """Preferences over CartPole fragments, saved as imitation saves them."""
    rng = np.random.default_rng(0)
    venv = util.make_vec_env("seals/CartPole-v0", n_envs=1, rng=rng)
    try:
        trajectories = rollout.generate_trajectories(
            None,
            venv,
            rollout.make_min_timesteps(400),
            rng=rng,
        )
    finally:
        venv.close()
    pairs = pc.RandomFragmenter(rng=rng, warning_threshold=0)(
        trajectories, fragment_length=8, num_pairs=20
    )
    dataset = pc.PreferenceDataset()
    dataset.push(pairs, pc.SyntheticGatherer(rng=rng)(pairs))
    path = tmp_path_factory.mktemp("data") / "preferences.pkl"
    dataset.save(path)
    return path


def test_convert_keeps_every_pair(rng, tmp_path):
    pairs, prefs = make_pairs(rng, 5), preferences_of(rng, 5)
    original = pc.PreferenceDataset(max_size=7)
    original.push(pairs, prefs)
    original.save(tmp_path / "in.pkl")
    code = convert_preferences.main([str(tmp_path / "in.pkl"), str(tmp_path / "out")])
    assert code == 0
    store = PreferenceDataset.load(tmp_path / "out", verify=True)
    assert store.max_size == 7
    assert_same_pairs(store, pairs, prefs)


def test_convert_command_line_names_a_bad_input(tmp_path):
    (tmp_path / "in.pkl").write_bytes(b"not a pickle")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "imitation_accum.scripts.convert_preferences",
            str(tmp_path / "in.pkl"),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "in.pkl is not a readable PreferenceDataset pickle" in done.stderr
    assert not (tmp_path / "out").exists()


def pickled(rng, tmp_path: pathlib.Path, prefs: np.ndarray) -> pathlib.Path:
    original = pc.PreferenceDataset()
    original.push(make_pairs(rng, len(prefs)), prefs)
    tmp_path.mkdir(exist_ok=True)
    original.save(tmp_path / "in.pkl")
    return tmp_path / "in.pkl"


def test_convert_refuses_an_existing_target_unless_told(rng, tmp_path, capsys):
    source = pickled(rng, tmp_path, preferences_of(rng, 3))
    target = tmp_path / "out"
    assert convert_preferences.main([str(source), str(target)]) == 0
    before = PreferenceDataset.load(target).fingerprint()
    other = pickled(rng, tmp_path / "other", preferences_of(rng, 2))
    assert convert_preferences.main([str(other), str(target)]) == 2
    assert f"{target} exists; pass --overwrite" in capsys.readouterr().err
    assert PreferenceDataset.load(target).fingerprint() == before
    code = convert_preferences.main([str(other), str(target), "--overwrite"])
    assert code == 0 and len(PreferenceDataset.load(target)) == 2
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match="file exists; pass --overwrite"):
        convert_preferences.convert(other, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("bad", [1.5, np.nan])
def test_convert_names_a_preference_outside_the_unit_interval(rng, tmp_path, bad):
    source = pickled(rng, tmp_path, np.array([0.5, 0.0, bad, 1.0], np.float32))
    with pytest.raises(ValueError, match=r"in\.pkl: pair 2 has preference"):
        convert_preferences.convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def run(tmp_path: pathlib.Path, dataset_path, name: str, **updates):
    config = {
        "dataset_path": str(dataset_path),
        "seed": 7,
        "logging": {"log_dir": str(tmp_path / name), "log_format_strs": []},
        **updates,
    }
    result = ex.run(named_configs=["fast"], config_updates=config)
    assert result.status == "COMPLETED"
    return result.result


def test_store_trains_as_the_trusted_pickle(tmp_path, cartpole_pickle):
    store = tmp_path / "store"
    assert convert_preferences.main([str(cartpole_pickle), str(store)]) == 0
    from_pickle = run(tmp_path, cartpole_pickle, "pickle", trust_pickle=True)
    from_store = run(tmp_path, store, "store")
    assert from_store["held_out"] == from_pickle["held_out"]
    a = checkpoint.load_reward_net(from_pickle["reward_net"]).state_dict()
    b = checkpoint.load_reward_net(from_store["reward_net"]).state_dict()
    assert a.keys() == b.keys()
    assert all(th.equal(a[k], b[k]) for k in a)


def test_a_pickle_needs_the_trust_key(tmp_path, cartpole_pickle):
    with pytest.raises(ValueError, match=r"is a pickle.*set trust_pickle=True"):
        run(tmp_path, cartpole_pickle, "untrusted")


def test_a_corrupt_store_is_named(tmp_path, cartpole_pickle):
    store = tmp_path / "store"
    convert_preferences.main([str(cartpole_pickle), str(store)])
    frames = store / "frames.npy"
    frames.write_bytes(frames.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"frames\.npy.*truncated"):
        run(tmp_path, store, "corrupt")


def test_a_store_of_other_observations_is_named(tmp_path, rng):
    dataset = PreferenceDataset()
    dataset.push(make_pairs(rng, 12), preferences_of(rng, 12))
    dataset.save(tmp_path / "frames")
    with pytest.raises(ValueError, match=r"frames\.npy.*observation space"):
        run(tmp_path, tmp_path / "frames", "mismatch")


def test_patch_gives_imitation_the_frame_store(rng):
    """Under ``patch()`` imitation's ``PreferenceComparisons`` keeps a frame store."""
    import imitation_accum

    assert pc.PreferenceDataset is not PreferenceDataset
    with imitation_accum.patched():
        assert pc.PreferenceDataset is PreferenceDataset
        dataset = pc.PreferenceDataset(max_size=3)
        dataset.push(make_pairs(rng, 4), preferences_of(rng, 4))
        assert len(dataset) == 3
    assert pc.PreferenceDataset is not PreferenceDataset
