"""Resume of the preference experiment's other paths: ensembles, trajectory files.

A reward ensemble, and trajectories from a file (``trajectory_path``) instead of an
agent. Each run is stopped (by an error) after its second checkpoint and resumed; its
final reward net (every member's parameters and norm statistics), each member's
optimizer state and the preference dataset must equal the uninterrupted run's,
bit for bit.
"""

import pathlib

import numpy as np
import pytest
import seals  # noqa: F401  (registers seals/CartPole-v0)
import torch as th
from imitation.data import rollout, serialize
from imitation.util import util

from imitation_accum.io import run_checkpoint
from imitation_accum.preference import resumable

from . import test_resume_preference_comparisons as base

ENSEMBLE = {"reward": {"ensemble_size": 2}}
ENSEMBLE_CONFIGS = ("fast", "reward.reward_ensemble")


def _state(run_dir: pathlib.Path):
    last = run_checkpoint.complete(run_checkpoint.root(run_dir))[-1]
    assert last.name == f"{base.ITERATIONS:06d}"
    state = th.load(last / "state.pt", weights_only=True)
    opened = resumable.open_preferences(last)
    assert opened is not None
    store, _ = opened
    arrays = {
        name: store._columns[name].to_array()
        for name in ("frames", "acts", "fragments", "preferences")
    }
    return state, arrays


def _flat(value, prefix=""):
    """Tensors and numbers of a nested state, by path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flat(item, f"{prefix}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _flat(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def _differences(a, b, keys=("trainer", "members")):
    (state_a, arrays_a), (state_b, arrays_b) = a, b
    found = []
    for key in keys:
        flat_b = dict(_flat(state_b[key], key))
        for path, value in _flat(state_a[key], key):
            other = flat_b.get(path)
            if isinstance(value, th.Tensor):
                same = isinstance(other, th.Tensor) and th.equal(value, other)
            else:
                same = repr(value) == repr(other)
            if not same:
                found.append(path)
    found += [k for k in arrays_a if not np.array_equal(arrays_a[k], arrays_b[k])]
    return found


def _run(log_dir, named_configs, **updates):
    config = {
        **base.CONFIG,
        "logging": {**base.LOGS, "log_dir": str(log_dir)},
        **updates,
    }
    result = base.ex.run(named_configs=list(named_configs), config_updates=config)
    assert result.status == "COMPLETED"


def _stop_after(log_dir, count, monkeypatch, named_configs, **updates):
    write = run_checkpoint.write

    def stopping(directory, written, **kwargs):
        path = write(directory, written, **kwargs)
        if written == count:
            raise base.StopError
        return path

    with monkeypatch.context() as patched:
        patched.setattr(run_checkpoint, "write", stopping)
        with pytest.raises(base.StopError):
            _run(log_dir, named_configs, **updates)


def _stopped_and_resumed(tmp_path, monkeypatch, named_configs, **updates):
    uninterrupted = tmp_path / "uninterrupted"
    _run(uninterrupted, named_configs, **updates)
    stopped = tmp_path / "stopped"
    _stop_after(stopped, 2, monkeypatch, named_configs, **updates)
    base.resume(stopped, named_configs, **updates)
    return _state(uninterrupted), _state(stopped)


def test_reward_ensemble_resumes_bit_identically(tmp_path, monkeypatch):
    whole, resumed = _stopped_and_resumed(
        tmp_path, monkeypatch, ENSEMBLE_CONFIGS, **ENSEMBLE
    )
    assert len(whole[0]["members"]) == 2
    assert _differences(resumed, whole) == []
    # The comparison can fail: members' states differ from each other.
    swapped = ({**resumed[0], "members": resumed[0]["members"][::-1]}, resumed[1])
    assert _differences(swapped, whole)


@pytest.fixture
def trajectory_file(tmp_path):
    """Random-policy CartPole trajectories, saved as imitation saves them."""
    rng = np.random.default_rng(0)
    venv = util.make_vec_env("seals/CartPole-v0", n_envs=2, rng=rng)
    trajectories = rollout.generate_trajectories(
        None, venv, rollout.make_min_episodes(4), rng=rng
    )
    path = tmp_path / "trajectories"
    serialize.save(path, trajectories)
    return path


def test_trajectory_path_run_resumes_bit_identically(
    tmp_path, monkeypatch, trajectory_file
):
    updates = {"trajectory_path": str(trajectory_file)}
    whole, resumed = _stopped_and_resumed(tmp_path, monkeypatch, ("fast",), **updates)
    assert _differences(resumed, whole, keys=("trainer",)) == []
    last = run_checkpoint.complete(run_checkpoint.root(tmp_path / "stopped"))[-1]
    assert not (last / "agent.zip").exists()  # no agent: the file is the source
    # The comparison can fail: a run from another seed differs.
    _run(tmp_path / "other_seed", ("fast",), **updates, seed=4)
    assert _differences(_state(tmp_path / "other_seed"), whole, keys=("trainer",))
