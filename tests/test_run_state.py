"""Parts of an online run's checkpoint: environments, expert batches, directories."""

import functools
import pathlib
import pickle
import signal
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common import vec_env
from torch.utils import data as data_th

from imitation_accum.adversarial.resumable import ExpertBatches
from imitation_accum.io import atomic, run_checkpoint, run_state


def make_venv(seed=0):
    venv = vec_env.DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    venv.seed(seed)
    venv.reset()
    return venv


def rollout(venv, steps=30):
    return [venv.step(np.array([t % 2, (t // 2) % 2]))[0] for t in range(steps)]


def test_environments_restored_step_on_as_the_saved_ones():
    venv = make_venv()
    rollout(venv, 7)
    saved = run_state.save_environments(venv, {})
    expected = rollout(venv)
    other = make_venv(seed=123)  # another run's, in another state
    run_state.restore_environments(other, saved, {}, "test")
    assert all(np.array_equal(a, b) for a, b in zip(rollout(other), expected))
    # Without the restore they differ: the check above can fail.
    fresh = make_venv(seed=123)
    assert not all(np.array_equal(a, b) for a, b in zip(rollout(fresh), expected))


def test_vec_normalize_statistics_are_saved_with_the_environments():
    venv = vec_env.VecNormalize(make_venv())
    rollout(venv, 9)
    saved = run_state.save_environments(venv, {})
    other = vec_env.VecNormalize(make_venv(seed=5))
    run_state.restore_environments(other, saved, {}, "test")
    assert np.array_equal(other.obs_rms.mean, venv.obs_rms.mean)
    assert np.array_equal(other.ret_rms.var, venv.ret_rms.var)
    assert all(np.array_equal(a, b) for a, b in zip(rollout(other), rollout(venv)))


def test_environments_referring_to_an_unnamed_net_are_not_saved():
    venv = make_venv()
    venv.envs[0].unwrapped.net = th.nn.Linear(1, 1)
    with pytest.raises(pickle.PicklingError, match="Linear"):
        run_state.save_environments(venv, {})
    net = venv.envs[0].unwrapped.net
    saved = run_state.save_environments(venv, {"net": net})
    other = make_venv()
    other.envs[0].unwrapped.net = th.nn.Linear(1, 1)
    run_state.restore_environments(other, saved, {"net": net}, "test")
    assert other.envs[0].unwrapped.net is net  # the named object, not a copy


def test_expert_batches_resume_inside_a_pass():
    loader = data_th.DataLoader(list(range(10)), 3, shuffle=True, drop_last=True)
    th.manual_seed(0)
    batches = ExpertBatches(loader)
    for _ in range(4):  # one pass of three batches and one of the next
        next(batches)
    state, rng = batches.state(), th.get_rng_state()
    expected = [next(batches).tolist() for _ in range(5)]
    th.manual_seed(99)
    resumed = ExpertBatches(loader)
    resumed.restore(state)
    th.set_rng_state(rng)
    assert [next(resumed).tolist() for _ in range(5)] == expected
    th.set_rng_state(rng)  # not restored: a new pass, other batches
    fresh = ExpertBatches(loader)
    assert [next(fresh).tolist() for _ in range(5)] != expected


def test_atomic_directory_is_complete_or_absent(tmp_path):
    target = tmp_path / "checkpoint"
    with pytest.raises(RuntimeError), atomic.atomic_directory(target) as temporary:
        (temporary / "a").write_bytes(b"1")
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []
    with atomic.atomic_directory(target) as temporary:
        (temporary / "a").write_bytes(b"1")
    assert (target / "a").read_bytes() == b"1"
    killed = atomic.temporary_sibling(target)
    killed.mkdir()  # what a process killed inside the block leaves
    (killed / "a").write_bytes(b"")
    assert atomic.remove_stale_temporaries(target) == [killed]
    assert not killed.exists()
    refused = pytest.raises(FileExistsError, match="checkpoint")
    with refused, atomic.atomic_directory(target):
        pass


def test_a_write_keeps_the_last_checkpoint_and_removes_partial_ones(tmp_path):
    def write(count):
        return run_checkpoint.write(
            tmp_path,
            count,
            experiment="e",
            command="c",
            config={"seed": 1},
            write_files=lambda d: (d / "f").write_bytes(b"x" * count) and {},
        )

    write(1)
    partial = run_checkpoint.root(tmp_path) / f".000002.x{atomic.TEMPORARY_SUFFIX}"
    partial.mkdir()  # a write killed before its rename
    assert run_checkpoint.complete(run_checkpoint.root(tmp_path))[-1].name == "000001"
    last = write(2)
    assert run_checkpoint.complete(run_checkpoint.root(tmp_path)) == [last]
    assert not partial.exists()
    manifest = run_checkpoint.read_manifest(last, "e", "resume_from")
    assert manifest["files"]["f"]["bytes"] == 2
    with pytest.raises(ValueError, match="is a checkpoint of 'e', not of other"):
        run_checkpoint.read_manifest(last, "other", "resume_from")


_CRASHING_WRITE = """
import os, signal, sys
from imitation_accum.io import atomic, run_checkpoint
log_dir, where = sys.argv[1], sys.argv[2]
def crash(*args):
    os.kill(os.getpid(), signal.SIGKILL)  # no handler, no cleanup: a crash
def write(count):
    def files(directory):
        (directory / "a").write_bytes(bytes([count]) * 4096)
        if count == 2 and where == "files":
            crash()
        (directory / "b").write_bytes(bytes([count]) * 4096)
        return {"count": count}
    run_checkpoint.write(
        log_dir, count, experiment="e", command="c", config={}, write_files=files
    )
write(1)
if where == "rename":  # written and fsync-ed, not yet renamed into place
    atomic._move_in = crash
if where == "discard":  # in place, the older one not yet removed
    run_checkpoint._discard = crash
write(2)
"""


@pytest.mark.parametrize("where", ["files", "rename", "discard"])
def test_a_crash_while_checkpointing_leaves_the_old_or_the_new_one(tmp_path, where):
    done = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITE, str(tmp_path), where],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    latest = run_checkpoint.complete(run_checkpoint.root(tmp_path))[-1]
    manifest = run_checkpoint.read_manifest(latest, "e", "resume_from")
    count = 2 if where == "discard" else 1
    assert manifest["metadata"] == {"count": count}
    for name in ("a", "b"):  # every file of that one write, none of the other
        assert (latest / name).read_bytes() == bytes([count]) * 4096


def test_shared_files_are_checked_and_unnamed_shared_directories_removed(tmp_path):
    root = run_checkpoint.root(tmp_path)

    def write(count, store):
        def files(directory):
            (root / store).mkdir(exist_ok=True)
            with open(root / store / "a.npy", "ab") as file:
                file.write(b"x" * 10)
            size = (root / store / "a.npy").stat().st_size
            return {"n": count, run_checkpoint.SHARED: {f"{store}/a.npy": size}}

        return run_checkpoint.write(
            tmp_path, count, experiment="e", command="c", config={}, write_files=files
        )

    write(1, "s.1")
    last = write(2, "s.1")
    manifest = run_checkpoint.read_manifest(last, "e", "resume_from")
    assert manifest["shared"] == {"s.1/a.npy": {"bytes": 20}}
    assert manifest["metadata"] == {"n": 2}
    with open(root / "s.1" / "a.npy", "ab") as file:
        file.write(b"uncommitted")  # longer than committed: fine
    run_checkpoint.read_manifest(last, "e", "resume_from")
    (root / "s.1" / "a.npy").write_bytes(b"x" * 19)
    shared = root / "s.1" / "a.npy"
    with pytest.raises(ValueError, match=rf"'{shared}' is truncated or altered"):
        run_checkpoint.read_manifest(last, "e", "resume_from")
    last = write(3, "s.3")  # a new store: the one no checkpoint names goes
    assert sorted(p.name for p in root.iterdir()) == ["000003", "s.3"]
    for bad in ["../x/a.npy", "s.3/../a.npy", "000003/a.npy", "a.npy", "/s/a.npy"]:
        with pytest.raises(ValueError, match="is not DIRECTORY/FILE"):
            run_checkpoint.write(
                tmp_path,
                4,
                experiment="e",
                command="c",
                config={},
                write_files=lambda d, bad=bad: {run_checkpoint.SHARED: {bad: 1}},
            )
    assert sorted(p.name for p in root.iterdir()) == ["000003", "s.3"]


def test_configs_compare_key_by_key():
    saved = {"a": {"b": 1, "c": {}}, "logging": {"log_dir": "x"}}
    compare = functools.partial(
        run_checkpoint.compare_configs, may_change=["logging."], where="w", hint=""
    )
    # An empty section is no key; a key that may change is returned.
    assert compare(saved, {"a": {"b": 1}, "logging": {"log_dir": "y"}}) == [
        ("logging.log_dir", "'x'", "'y'")
    ]
    with pytest.raises(ValueError, match=r"w was written with a.b=1, but this run"):
        compare(saved, {"a": {"b": 2}, "logging": {"log_dir": "x"}})
    shown = r"without a.d, but this run has a.d=\(1, 2\)"
    with pytest.raises(ValueError, match=shown):
        compare(saved, {"a": {"b": 1, "d": {"py/tuple": [1, 2]}}})
    # A path reads as one, not as jsonpickle's reduction.
    paths = run_checkpoint.json_config(
        {"a": {"b": 1}, "logging": {"log_dir": pathlib.Path("/runs/x")}}
    )
    assert compare(saved, paths) == [("logging.log_dir", "'x'", "'/runs/x'")]
