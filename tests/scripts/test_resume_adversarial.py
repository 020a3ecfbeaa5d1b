"""GAIL and AIRL runs that stop (an error, ``kill -9``) and resume bit for bit.

seals/CartPole-v0 in a DummyVecEnv, six rounds on the ``fast`` budget, CPU, seed
fixed. A resumed run must end with the discriminator (reward net and optimizer),
the generator and its replay buffer of the uninterrupted run, bit for bit.
"""

import json
import os
import pathlib
import pickle
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch as th
from stable_baselines3.common import save_util

from imitation_accum.integrations import demonstrations
from imitation_accum.io import run_checkpoint
from imitation_accum.scripts.train_adversarial import train_adversarial_ex as ex

ROUNDS = 6  # total_timesteps / (2 environments x 1 step)
LOGS = {"log_format_strs": ["csv", "log"]}


class StopError(Exception):
    """Raised to stop a run after a checkpoint."""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    demos = tmp_path_factory.mktemp("demos") / "demos"
    demonstrations.make_demonstrations(
        demos, gym_id="seals/CartPole-v0", n_episodes=2, max_episode_steps=5
    )
    return {
        "demonstrations": {"source": "local", "path": str(demos)},
        "total_timesteps": 2 * ROUNDS,
        # 3 batches a pass over the 10 expert transitions, 2 taken a round: a
        # stop after round 2 falls inside a pass.
        "algorithm_kwargs": {"demo_batch_size": 3},
        "seed": 4,
    }


def run(config, log_dir, command="gail", **updates):
    updates = {**config, "logging": {**LOGS, "log_dir": str(log_dir)}, **updates}
    result = ex.run(
        command_name=command, named_configs=["fast"], config_updates=updates
    )
    assert result.status == "COMPLETED"
    return result


def resume(config, run_dir, command="gail", **updates):
    updates = {
        **{k: v for k, v in config.items() if k != "seed"},
        "logging": LOGS,
        "resume_from": str(run_dir),
        "trust_pickle": True,  # the checkpoint's replay buffer is a pickle
        **updates,
    }
    result = ex.run(
        command_name=command, named_configs=["fast"], config_updates=updates
    )
    assert result.status == "COMPLETED"
    return result


def run_until(config, log_dir, count, monkeypatch, command="gail"):
    """Runs, stopping by an error once checkpoint ``count`` is written."""
    write = run_checkpoint.write

    def stopping(directory, written, **kwargs):
        path = write(directory, written, **kwargs)
        if written == count:
            raise StopError
        return path

    with monkeypatch.context() as patched:
        patched.setattr(run_checkpoint, "write", stopping)
        with pytest.raises(StopError):
            run(config, log_dir, command)


def final_state(run_dir):
    """Discriminator, generator and replay buffer of the last checkpoint."""
    last = run_checkpoint.complete(run_checkpoint.root(run_dir))[-1]
    assert last.name == f"{ROUNDS:06d}"
    state = th.load(last / "state.pt", weights_only=True)
    _, agent, _ = save_util.load_from_zip_file(last / "agent.zip")
    replay = pickle.loads((last / "replay_buffer.pkl").read_bytes())
    arrays = {k: v for k, v in replay._buffer._arrays.items() if k != "infos"}
    return state, agent, arrays


def differences(a, b):
    """What differs, bit for bit, between two :func:`final_state`."""
    (state_a, agent_a, replay_a), (state_b, agent_b, replay_b) = a, b
    found = [
        f"reward net {k}"
        for k, v in state_a["net_state"].items()
        if not th.equal(v, state_b["net_state"][k])
    ]
    if repr(state_a["optimizer_state"]) != repr(state_b["optimizer_state"]):
        found.append("discriminator optimizer")
    for module, params in agent_a.items():
        for name, value in params.items():
            tensor = isinstance(value, th.Tensor)
            other = agent_b[module][name]
            if not th.equal(value, other) if tensor else repr(value) != repr(other):
                found.append(f"agent {module}.{name}")
    found += [
        f"replay buffer {k}"
        for k in replay_a
        if not np.array_equal(replay_a[k], replay_b[k])
    ]
    if state_a["global_step"] != state_b["global_step"]:
        found.append("global step")
    return found


@pytest.fixture(scope="module")
def uninterrupted(config, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    run(config, log_dir)
    return final_state(log_dir)


@pytest.fixture(scope="module")
def stopped(config, tmp_path_factory):
    """A GAIL run directory stopped (by an error) after round 2."""
    log_dir = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_until(config, log_dir, 2, monkeypatch)
    return log_dir


def copy_run(source, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("run.lock"))
    return target


def test_resumed_gail_equals_uninterrupted(config, uninterrupted, stopped, tmp_path):
    run_dir = copy_run(stopped, tmp_path)
    resume(config, run_dir)
    assert differences(final_state(run_dir), uninterrupted) == []
    assert "Resumed from" in (run_dir / "log" / "log.txt").read_text()


def test_environments_restarted_from_reset_do_not_equal_uninterrupted(
    config, uninterrupted, stopped, tmp_path
):
    run_dir = copy_run(stopped, tmp_path)
    checkpoint = run_checkpoint.complete(run_checkpoint.root(run_dir))[-1]
    (checkpoint / "environments.pkl").unlink()
    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    del manifest["files"]["environments.pkl"]
    (checkpoint / "checkpoint.json").write_text(json.dumps(manifest))
    resume(config, run_dir)
    assert differences(final_state(run_dir), uninterrupted)


def test_resumed_airl_equals_uninterrupted(config, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    run(config, whole, "airl")
    run_dir = tmp_path / "run"
    run_until(config, run_dir, 2, monkeypatch, "airl")
    resume(config, run_dir, "airl")
    assert differences(final_state(run_dir), final_state(whole)) == []


def test_other_command_and_changed_config_are_refused(config, stopped, tmp_path):
    run_dir = copy_run(stopped, tmp_path)
    before = sorted(p.name for p in run_dir.rglob("*"))
    with pytest.raises(ValueError, match=r"replay_buffer\.pkl, a pickle.*trust_pickle"):
        resume(config, run_dir, trust_pickle=False)
    with pytest.raises(TypeError, match="trust_pickle must be a bool"):
        resume(config, run_dir, trust_pickle="yes")
    assert sorted(p.name for p in run_dir.rglob("*")) == before
    with pytest.raises(ValueError, match=r"checkpoint of the 'gail' command, not of"):
        resume(config, run_dir, "airl")
    with pytest.raises(
        ValueError,
        match=r"with algorithm_kwargs.demo_batch_size=3, but this run has "
        r"algorithm_kwargs.demo_batch_size=6",
    ):
        resume(config, run_dir, algorithm_kwargs={"demo_batch_size": 6})


#: File operations (fsync, rename, removal) of the GAIL run's six checkpoint writes.
WRITE_OPERATIONS = 58


def kill_and_resume(config, tmp_path, kill_at, uninterrupted):
    """Runs GAIL in a process that kills itself at file operation ``kill_at``."""
    log_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "tests.scripts.resume_driver",
        str(log_dir),
        json.dumps({**config, "command": "gail"}),
        str(kill_at),
    ]
    child = subprocess.run(
        command,
        cwd=pathlib.Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    resume(config, log_dir)
    assert differences(final_state(log_dir), uninterrupted) == []


def test_killed_gail_resumes(config, uninterrupted, tmp_path):
    # Inside its fourth checkpoint write (about ten file operations each).
    kill_and_resume(config, tmp_path, 40, uninterrupted)


@pytest.mark.expensive
@pytest.mark.parametrize("trial", range(20))
def test_killed_gail_resumes_20_trials(config, uninterrupted, tmp_path, trial):
    kill_at = int(np.random.default_rng(100 + trial).integers(1, WRITE_OPERATIONS + 1))
    kill_and_resume(config, tmp_path, kill_at, uninterrupted)


def test_unsaved_environments_warned_once_a_run(config, tmp_path, monkeypatch):
    # As for preference comparisons: one warning, not one every round.
    from imitation_accum.io import run_state

    def unpicklable(venv, shared):
        raise TypeError("cannot pickle a worker process")

    monkeypatch.setattr(run_state, "save_environments", unpicklable)
    run(config, tmp_path / "run")
    log = (tmp_path / "run" / "log" / "log.txt").read_text()
    assert log.count("The environments cannot be saved") == 1
    assert log.count("Checkpoint after round") == ROUNDS
