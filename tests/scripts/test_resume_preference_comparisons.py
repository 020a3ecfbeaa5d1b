"""Preference-comparison runs that stop (an error, ``kill -9``) and resume bit for bit.

The run: seals/CartPole-v0 in a DummyVecEnv, four iterations on a tiny budget, on
the CPU, seed fixed. A resumed run must end with the reward net, the agent and the
preference dataset of the uninterrupted one, bit for bit.
"""

import itertools
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch as th
from stable_baselines3.common import save_util

from imitation_accum.io import frame_store, run_checkpoint
from imitation_accum.preference import resumable
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex as ex,
)

CONFIG = {
    "total_timesteps": 64,
    "total_comparisons": 12,
    "num_iterations": 3,  # four iterations: the initial one and three
    "fragment_length": 4,
    "initial_epoch_multiplier": 2.0,
    "reward_trainer_kwargs": {
        "epochs": 1,
        "batch_size": 4,
        "progress_bar": False,
        "forward_size": 8,
    },
    "rl": {"batch_size": 16, "rl_kwargs": {"batch_size": 8, "n_epochs": 1}},
    "seed": 3,
}
ITERATIONS = 4
LOGS = {"log_format_strs": ["csv", "log"]}


class StopError(Exception):
    """Raised to stop a run after a checkpoint."""


def run(log_dir: pathlib.Path, **updates):
    """The run in ``log_dir`` (``fast`` and CONFIG, then ``updates``)."""
    config = {**CONFIG, "logging": {**LOGS, "log_dir": str(log_dir)}, **updates}
    result = ex.run(named_configs=["fast"], config_updates=config)
    assert result.status == "COMPLETED"
    return result


def resume(run_dir: pathlib.Path, named_configs=("fast",), **updates):
    """Resumes the run in ``run_dir`` (its own directory, seed from the checkpoint)."""
    config = {
        **{k: v for k, v in CONFIG.items() if k != "seed"},
        "logging": LOGS,
        "resume_from": str(run_dir),
        **updates,
    }
    result = ex.run(named_configs=list(named_configs), config_updates=config)
    assert result.status == "COMPLETED"
    return result


def run_until(log_dir: pathlib.Path, count: int, monkeypatch, resume_from=None):
    """Runs (or resumes) and stops by an error once checkpoint ``count`` is written."""
    write = run_checkpoint.write

    def stopping(directory, written, **kwargs):
        path = write(directory, written, **kwargs)
        if written == count:
            raise StopError
        return path

    with monkeypatch.context() as patched:
        patched.setattr(run_checkpoint, "write", stopping)
        with pytest.raises(StopError):
            if resume_from is None:
                run(log_dir)
            else:
                resume(resume_from)


def final_state(run_dir: pathlib.Path):
    """Reward net, agent parameters and preference arrays of the last checkpoint."""
    last = run_checkpoint.complete(run_checkpoint.root(run_dir))[-1]
    assert last.name == f"{ITERATIONS:06d}"
    state = th.load(last / "state.pt", weights_only=True)
    _, agent, _ = save_util.load_from_zip_file(last / "agent.zip")
    opened = resumable.open_preferences(last)
    assert opened is not None
    store, _ = opened
    # infos are left out: Monitor's episode info holds wall-clock time.
    arrays = {
        name: store._columns[name].to_array()
        for name in ("frames", "obs_frames", "acts", "rews", "fragments", "preferences")
    }
    return state["trainer"]["net_state"], agent, arrays


def differences(a, b):
    """Names of what differs (bit for bit) between two :func:`final_state`."""
    net_a, agent_a, arrays_a = a
    net_b, agent_b, arrays_b = b
    found = [f"reward net {k}" for k in net_a if not th.equal(net_a[k], net_b[k])]
    for module, params in agent_a.items():
        for name, value in params.items():
            other = agent_b[module][name]
            tensor = isinstance(value, th.Tensor)
            if not th.equal(value, other) if tensor else repr(value) != repr(other):
                found.append(f"agent {module}.{name}")
    found += [
        f"preferences {k}"
        for k in arrays_a
        if not np.array_equal(arrays_a[k], arrays_b[k])
    ]
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final state of the run that was not stopped."""
    log_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    run(log_dir)
    return final_state(log_dir)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run directory stopped (by an error) after its second iteration."""
    log_dir = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_until(log_dir, 2, monkeypatch)
    return log_dir


def copy_run(source: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / "run"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("run.lock"))
    return target


def files_under(directory: pathlib.Path) -> dict:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != "run.lock"
    }


# --- stopped and resumed: the uninterrupted run, bit for bit ------------------


def test_resumed_twice_equals_uninterrupted_and_appends_logs(
    uninterrupted, stopped, tmp_path, monkeypatch
):
    run_dir = copy_run(stopped, tmp_path)
    progress = (run_dir / "log" / "progress.csv").read_text()
    assert len(progress.splitlines()) == 1 + 2  # header, iterations 0 and 1
    run_until(run_dir, 3, monkeypatch, resume_from=run_dir)
    resumed = resume(run_dir)
    assert resumed.config["logging"]["log_dir"] == str(run_dir)
    assert resumed.config["seed"] == CONFIG["seed"]
    assert differences(final_state(run_dir), uninterrupted) == []
    # The logs were continued, not started anew: the first rows are kept.
    after = (run_dir / "log" / "progress.csv").read_text()
    assert after.startswith(progress)
    assert len(after.splitlines()) == 1 + ITERATIONS
    text = (run_dir / "log" / "log.txt").read_text()
    assert "Resumed from" in text and "after iteration 2" in text
    # One checkpoint is kept, the last.
    assert [p.name for p in run_checkpoint.complete(run_checkpoint.root(run_dir))] == [
        f"{ITERATIONS:06d}"
    ]


def test_environments_restarted_from_reset_do_not_equal_uninterrupted(
    uninterrupted, stopped, tmp_path
):
    # Where environments cannot be saved they restart from reset (logged): the
    # resume then differs, which shows the comparison above can fail.
    run_dir = copy_run(stopped, tmp_path)
    checkpoint = run_checkpoint.complete(run_checkpoint.root(run_dir))[-1]
    (checkpoint / "environments.pkl").unlink()
    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    del manifest["files"]["environments.pkl"]
    (checkpoint / "checkpoint.json").write_text(json.dumps(manifest))
    resume(run_dir)
    assert differences(final_state(run_dir), uninterrupted)
    text = (run_dir / "log" / "log.txt").read_text()
    assert "they restart from reset with seed" in text


def test_stopped_before_its_first_checkpoint_starts_over_in_its_directory(
    uninterrupted, stopped, tmp_path
):
    run_dir = copy_run(stopped, tmp_path)
    shutil.rmtree(run_dir / "checkpoints")
    shutil.rmtree(run_dir / "log")
    resume(run_dir)
    assert differences(final_state(run_dir), uninterrupted) == []


# --- the preference store grows in place -------------------------------------


def committed_data(checkpoint: pathlib.Path, name: str) -> bytes:
    """The data of array ``name`` of the store, as far as ``checkpoint`` commits."""
    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    entry = manifest["metadata"]["preferences"]["manifest"]["arrays"][name]
    data = (store_of(checkpoint) / entry["file"]).read_bytes()
    n_bytes = manifest["shared"][f"{store_of(checkpoint).name}/{entry['file']}"]
    return data[n_bytes["bytes"] - entry["bytes"] : n_bytes["bytes"]]


def test_each_checkpoint_appends_only_its_new_pairs(tmp_path, monkeypatch):
    appended = []  # per append: the store and the pairs written
    append = frame_store.Appender.append

    def counting(store, arrays, shapes, metadata, env_id=None):
        arrays = {name: list(blocks) for name, blocks in arrays.items()}
        appended.append((store.path, sum(map(len, arrays["preferences"]))))
        return append(store, arrays, shapes, metadata, env_id)

    seen = []  # per checkpoint: its store's frames file, inode and committed frames
    write = run_checkpoint.write

    def recording(directory, count, **kwargs):
        path = write(directory, count, **kwargs)
        frames = store_of(path) / "frames.npy"
        seen.append((frames, frames.stat().st_ino, committed_data(path, "frames")))
        return path

    monkeypatch.setattr(frame_store.Appender, "append", counting)
    monkeypatch.setattr(run_checkpoint, "write", recording)
    log_dir = tmp_path / "run"
    run(log_dir)
    opened = resumable.open_preferences(last_checkpoint(log_dir))
    assert opened is not None
    # One store, one file, grown: each checkpoint's frames begin with the last's.
    assert len(seen) == ITERATIONS
    assert len({(frames, inode) for frames, inode, _ in seen}) == 1
    for (_, _, before), (_, _, after) in itertools.pairwise(seen):
        assert len(after) > len(before) and after.startswith(before)
    # Each pair was written once, by the checkpoint after the iteration that
    # gathered it.
    assert len(appended) == ITERATIONS and all(n > 0 for _, n in appended)
    assert sum(n for _, n in appended) == len(opened[0])
    assert sorted(p.name for p in run_checkpoint.root(log_dir).iterdir()) == [
        f"{ITERATIONS:06d}",
        store_of(last_checkpoint(log_dir)).name,
    ]


def test_bytes_after_the_last_checkpoint_are_cut_off_at_resume(
    uninterrupted, stopped, tmp_path
):
    # The stopped run appended rows, rewrote headers and its store's manifest,
    # and was killed before its next checkpoint was in place.
    run_dir = copy_run(stopped, tmp_path)
    store = store_of(last_checkpoint(run_dir))
    for file in store.glob("*.npy"):
        with open(file, "r+b") as out:
            out.seek(out.read(256).index(b"'shape': (") + 10)
            out.write(b"99")  # the header's row count
            out.seek(0, 2)
            out.write(b"\xff" * 1000)
    (store / "manifest.json").write_text("{")
    resume(run_dir)
    assert differences(final_state(run_dir), uninterrupted) == []
    last = last_checkpoint(run_dir)
    assert store_of(last) == store
    manifest = json.loads((last / "checkpoint.json").read_text())
    assert {
        f"{store.name}/{p.name}": {"bytes": p.stat().st_size}
        for p in store.glob("*.npy")
    } == manifest["shared"]


def test_a_corrupt_committed_pair_is_refused_naming_the_file(stopped, tmp_path):
    run_dir = copy_run(stopped, tmp_path)
    frames = store_of(last_checkpoint(run_dir)) / "frames.npy"
    data = bytearray(frames.read_bytes())
    data[-3] ^= 0xFF
    frames.write_bytes(bytes(data))
    with pytest.raises(frame_store.StoreError, match=f"{frames}: the SHA-256"):
        resume(run_dir)


def test_a_bounded_dataset_starts_a_new_store_when_pairs_are_evicted(
    tmp_path, monkeypatch
):
    bounded = {"comparison_queue_size": 5}
    run(tmp_path / "uninterrupted", **bounded)
    expected = final_state(tmp_path / "uninterrupted")
    log_dir = tmp_path / "run"
    write = run_checkpoint.write

    def stopping(directory, written, **kwargs):
        path = write(directory, written, **kwargs)
        if written == 2:
            raise StopError
        return path

    with monkeypatch.context() as patched:
        patched.setattr(run_checkpoint, "write", stopping)
        with pytest.raises(StopError):
            run(log_dir, **bounded)
    first = store_of(last_checkpoint(log_dir))
    resume(log_dir, **bounded)
    assert differences(final_state(log_dir), expected) == []
    # Pairs were evicted after the second iteration: a new store, the old removed.
    store = store_of(last_checkpoint(log_dir))
    assert store != first and not first.exists()
    assert len(resumable.open_preferences(last_checkpoint(log_dir))[0]) == 5


# --- kill -9 at any moment ----------------------------------------------------

#: File operations (fsync, rename, removal) of the run's four checkpoint writes.
WRITE_OPERATIONS = 79


def kill_and_resume(tmp_path: pathlib.Path, trial: int, uninterrupted) -> None:
    """Runs in a process killed at a seeded moment; resumes; compares."""
    rng = np.random.default_rng(trial)
    log_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "tests.scripts.resume_driver",
        str(log_dir),
        json.dumps(CONFIG),
    ]
    during_write = trial % 2 == 0
    if during_write:  # inside a checkpoint write, or between its steps
        command.append(str(int(rng.integers(1, WRITE_OPERATIONS + 1))))
    root = pathlib.Path(__file__).parents[2]
    child = subprocess.Popen(  # same threads as this process: same round-off
        command,
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if not during_write:  # at a random moment once the run has begun
            while not (log_dir / "config.json").exists() and child.poll() is None:
                time.sleep(0.01)
            time.sleep(float(rng.uniform(0.0, 1.5)))  # the run takes about 1.5 s
            child.send_signal(signal.SIGKILL)
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode in (0, -signal.SIGKILL), stderr[-2000:]
    resume(log_dir)
    assert differences(final_state(log_dir), uninterrupted) == []


def test_sigterm_ends_the_run_with_143_and_it_resumes(tmp_path, uninterrupted):
    log_dir = tmp_path / "run"
    command = [sys.executable, "-m", "tests.scripts.resume_driver"]
    child = subprocess.Popen(
        [*command, str(log_dir), json.dumps(CONFIG)],
        cwd=pathlib.Path(__file__).parents[2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        checkpoints = run_checkpoint.root(log_dir)
        while not run_checkpoint.complete(checkpoints) and child.poll() is None:
            time.sleep(0.005)
        child.send_signal(signal.SIGTERM)  # in the second iteration
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert not list(checkpoints.glob(".*")), "a temporary directory was left"
    resume(log_dir)
    assert differences(final_state(log_dir), uninterrupted) == []


@pytest.mark.parametrize("trial", [0, 1])
def test_killed_at_any_moment_resumes(tmp_path, trial, uninterrupted):
    kill_and_resume(tmp_path, trial, uninterrupted)


@pytest.mark.expensive
@pytest.mark.parametrize("trial", range(2, 22))
def test_killed_at_any_moment_resumes_20_trials(tmp_path, trial, uninterrupted):
    kill_and_resume(tmp_path, trial, uninterrupted)


# --- refused before anything is written ---------------------------------------


def refused(run_dir: pathlib.Path, match: str, named_configs=("fast",), **updates):
    """Resuming ``run_dir`` raises a ``ValueError`` matching ``match``; no file."""
    before = files_under(run_dir) if run_dir.is_dir() else None
    with pytest.raises(ValueError, match=match):
        resume(run_dir, named_configs, **updates)
    after = files_under(run_dir) if run_dir.is_dir() else None
    assert after == before


def last_checkpoint(run_dir: pathlib.Path) -> pathlib.Path:
    return run_checkpoint.complete(run_checkpoint.root(run_dir))[-1]


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    refused(missing, rf"resume_from='{missing}': no such file or directory")
    assert not missing.exists()


def test_run_of_another_experiment_is_named(stopped, tmp_path):
    run_dir = tmp_path / "airl_run"
    run_dir.mkdir()
    config = {"algorithm_kwargs": {}, "demonstrations": {}, "seed": 1}
    (run_dir / "config.json").write_text(json.dumps(config))
    refused(run_dir, r"resume_from='.*airl_run' is a run of train_adversarial")
    copied = copy_run(stopped, tmp_path)
    manifest_path = last_checkpoint(copied) / "checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["experiment"] = "train_adversarial"
    manifest_path.write_text(json.dumps(manifest))
    refused(copied, r"is a checkpoint of 'train_adversarial', not of")


def test_checkpoint_of_another_format_version_is_named(stopped, tmp_path):
    run_dir = copy_run(stopped, tmp_path)
    manifest_path = last_checkpoint(run_dir) / "checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["version"] = run_checkpoint.VERSION + 1
    manifest_path.write_text(json.dumps(manifest))
    refused(
        run_dir, rf"'{manifest_path}' has format version {run_checkpoint.VERSION + 1}"
    )


def store_of(checkpoint: pathlib.Path) -> pathlib.Path:
    """The directory of the preference store that ``checkpoint`` commits rows of."""
    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    return checkpoint.parent / manifest["metadata"]["preferences"]["store"]


@pytest.mark.parametrize("name", ["agent.zip", "state.pt", "frames.npy"])
def test_truncated_checkpoint_is_named(stopped, tmp_path, name):
    run_dir = copy_run(stopped, tmp_path)
    checkpoint = last_checkpoint(run_dir)
    damaged = (store_of(checkpoint) if name == "frames.npy" else checkpoint) / name
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])
    refused(run_dir, rf"'{damaged}' is truncated or altered")


def test_changed_config_is_refused_naming_the_key(stopped, tmp_path):
    run_dir = copy_run(stopped, tmp_path)
    refused(
        run_dir,
        r"with fragment_length=4, but this run has fragment_length=3",
        fragment_length=3,
    )
    refused(
        run_dir,
        r"environment.gym_id='seals/CartPole-v0', but this run has "
        r"environment.gym_id='CartPole-v1'",
        environment={"gym_id": "CartPole-v1"},
    )
    refused(
        run_dir,
        r"without reward.net_kwargs.hid_sizes, but this run has "
        r"reward.net_kwargs.hid_sizes=\(8,\)",
        reward={"net_kwargs": {"hid_sizes": (8,)}},
    )
    # Without the named config `fast` the run had: the first key it set is named.
    refused(run_dir, r"was written with environment.max_episode_steps=5", ())


def test_total_timesteps_may_change_and_is_logged(stopped, tmp_path, caplog):
    run_dir = copy_run(stopped, tmp_path)
    with caplog.at_level("INFO"):
        result = resume(run_dir, total_timesteps=80)
    assert "Resuming with total_timesteps=80 (the run had 64)" in caplog.text
    assert result.config["total_timesteps"] == 80
