"""Runs lose no data: resumes continue logs, refusals write nothing, one run a dir.

Stop signals always stop; the sacred record begins after the checks.
"""

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
from sacred.config import custom_containers

from imitation_accum import checkpoint
from imitation_accum.integrations import demonstrations
from imitation_accum.scripts import experiment
from imitation_accum.scripts.train_adversarial import (
    train_adversarial_ex as adversarial_ex,
)
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex as preference_ex,
)
from tests.scripts import test_train_reward_model as offline

ex, run = offline.ex, offline.run
preferences_path = offline.preferences_path  # the fixture, for this module

CSV_AND_LOG = {"logging.log_format_strs": ["csv", "log"]}


def progress_rows(log_dir: pathlib.Path, sub: str = "") -> list:
    with open(log_dir / "log" / sub / "progress.csv") as file:
        return list(csv.DictReader(file))


def files_under(directory: pathlib.Path) -> dict:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


# --- item: a resume continues the run's logs --------------------------------


def test_resume_into_the_same_log_dir_appends_to_the_logs(tmp_path, preferences_path):
    first = run(
        tmp_path, preferences_path, **{"reward_trainer_kwargs.epochs": 2}, **CSV_AND_LOG
    )
    log_dir = tmp_path / "run"
    header = (log_dir / "log" / "progress.csv").read_text().splitlines()[0]
    log_text = (log_dir / "log" / "log.txt").read_text()
    raw_rows = len(progress_rows(log_dir, "raw/reward"))
    run(
        tmp_path,
        preferences_path,
        resume_from=first["training_state"],
        **{"reward_trainer_kwargs.epochs": 4},
        **CSV_AND_LOG,
    )
    lines = (log_dir / "log" / "progress.csv").read_text().splitlines()
    assert lines[0] == header and lines.count(header) == 1  # one header, same columns
    assert [float(r["epoch"]) for r in progress_rows(log_dir)] == [1, 2, 3, 4]
    assert (log_dir / "log" / "log.txt").read_text().startswith(log_text)
    assert len(progress_rows(log_dir, "raw/reward")) == 2 * raw_rows


def test_a_row_cut_short_is_dropped_when_appending(tmp_path):
    path = tmp_path / "progress.csv"
    path.write_text("a,b\n1,2\n3,")
    writer = experiment.AppendingCSVOutputFormat(str(path))
    writer.write({"a": 5, "b": 6}, {"a": None, "b": None})
    writer.write({"a": 7, "c": 8}, {"a": None, "c": None})  # a new key: a new column
    writer.close()
    assert path.read_text() == "a,b,c\n1,2,\n5,6,\n7,,8\n"
    path.write_text("a,")  # the header cut short
    writer = experiment.AppendingCSVOutputFormat(str(path))
    writer.write({"a": 1}, {"a": None})
    writer.close()
    assert path.read_text() == "a\n1\n"


# --- item: a refused resume writes nothing ----------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, preferences_path):
    """One epoch with an AdamW and no regularizer, logged to CSV."""
    tmp_path = tmp_path_factory.mktemp("finished")
    result = run(
        tmp_path, preferences_path, **{"reward_trainer_kwargs.epochs": 1}, **CSV_AND_LOG
    )
    return tmp_path / "run", pathlib.Path(result["training_state"])


@pytest.mark.parametrize(
    ("update", "named"),
    [
        ({"reward_trainer_kwargs.memory_budget": 100}, "memory_budget=100 B"),
        ({"reward_trainer_kwargs.optimizer_kwargs": {"weight_decay": -1}}, "weight"),
        ({"reward_trainer_kwargs.optimizer_cls": "SGD"}, "optimizer_cls='SGD'"),
        ({"regularizer.kind": "lp"}, "regularizer.kind='lp'"),
        ({"held_out_seed": 1}, "held_out_split"),
    ],
)
def test_a_refused_resume_leaves_the_run_directory_as_it_was(
    tmp_path, preferences_path, finished_run, update, named
):
    log_dir, state = finished_run
    before = files_under(log_dir)
    assert len(progress_rows(log_dir)) == 1
    with pytest.raises(ValueError, match=named):
        run(
            log_dir.parent,
            preferences_path,
            resume_from=str(state),
            **{"reward_trainer_kwargs.epochs": 3},
            **CSV_AND_LOG,
            **update,
        )
    assert files_under(log_dir) == before


def test_a_checkpoint_without_fingerprint_is_refused(
    tmp_path, preferences_path, finished_run
):
    _, state_path = finished_run
    state = checkpoint.load_training_state(state_path)
    del state.metadata["dataset_fingerprint"]
    old = checkpoint.save_training_state(state, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"other data \(fingerprint"):
        run(tmp_path, preferences_path, resume_from=str(old))
    assert not (tmp_path / "run").exists()


# --- item: one run per run directory ----------------------------------------

_HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def other_process_holding(tmp_path):
    """A process holding ``tmp_path/run``'s lock, as a running experiment does."""
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLD_LOCK), str(log_dir / "run.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "locked\n"
    yield log_dir, holder
    holder.kill()
    holder.wait()


def test_a_second_run_on_a_live_log_dir_is_refused(
    tmp_path, preferences_path, other_process_holding
):
    log_dir, holder = other_process_holding
    with pytest.raises(
        experiment.RunDirectoryInUseError,
        match=rf"logging\.log_dir='{log_dir}' is in use by another run \(pid "
        rf"{holder.pid},",
    ):
        run(tmp_path, preferences_path, **CSV_AND_LOG)
    assert sorted(p.name for p in log_dir.iterdir()) == ["run.lock"]
    # A crashed holder leaves its pid in the file, but the kernel freed the lock.
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    run(tmp_path, preferences_path, **CSV_AND_LOG)
    assert (log_dir / "run.lock").read_text() == ""  # released on exit
    with experiment.lock_run_directory(log_dir):  # nothing holds it now
        pass


def test_the_other_experiments_take_the_lock_too(tmp_path, other_process_holding):
    log_dir, holder = other_process_holding
    with pytest.raises(experiment.RunDirectoryInUseError, match=f"pid {holder.pid}"):
        preference_ex.run(
            named_configs=["fast"],
            config_updates={"logging": {"log_dir": str(log_dir)}},
        )
    assert sorted(p.name for p in log_dir.iterdir()) == ["run.lock"]


# --- issue 31: refused before the record; no earlier run overwritten ------------

ONLINE = {"train_preference_comparisons": preference_ex, "gail": adversarial_ex}


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "demos"
    demonstrations.make_demonstrations(
        path, gym_id="seals/CartPole-v0", n_episodes=2, max_episode_steps=5
    )
    return str(path)


def online_run(name: str, log_dir: pathlib.Path, demos: str, **updates):
    """A ``fast`` run of experiment ``name`` (or ``gail``) in ``log_dir``."""
    config = {"logging": {"log_dir": str(log_dir), "log_format_strs": ["csv", "log"]}}
    command = None
    if name == "gail":
        config["demonstrations"] = {"source": "local", "path": demos}
        command = name
    result = ONLINE[name].run(
        command, named_configs=["fast"], config_updates={**config, **updates}
    )
    assert result.status == "COMPLETED"
    return result


def recorded_under(ex, records: pathlib.Path, monkeypatch) -> None:
    # The command line's observer (RecordAfterChecks where the record is deferred).
    monkeypatch.setattr(ex, "observers", [experiment.record_observer(ex, records)])


def run_records(records: pathlib.Path) -> list:
    return [p for p in records.glob("*") if p.name != "_sources"]


@pytest.mark.parametrize("name", sorted(ONLINE))
def test_a_run_refused_by_the_lock_leaves_no_sacred_record(
    tmp_path, name, demos, other_process_holding, monkeypatch
):
    log_dir, holder = other_process_holding
    records = tmp_path / "sacred"
    recorded_under(ONLINE[name], records, monkeypatch)
    with pytest.raises(
        experiment.RunDirectoryInUseError,
        match=rf"^logging\.log_dir='{log_dir}' is in use by another run \(pid "
        rf"{holder.pid},",
    ):
        online_run(name, log_dir, demos)
    assert run_records(records) == []  # sacred would have left a FAILED one
    assert sorted(p.name for p in log_dir.iterdir()) == ["run.lock"]
    # Once the lock is free, the run is recorded: the record was deferred.
    holder.kill()
    holder.wait()
    online_run(name, log_dir, demos)
    (record,) = run_records(records)
    assert json.loads((record / "run.json").read_text())["status"] == "COMPLETED"
    assert (log_dir / "sacred").resolve() == record.resolve()


@pytest.mark.parametrize("name", sorted(ONLINE))
def test_a_fresh_online_run_into_an_earlier_run_is_refused(
    tmp_path, name, demos, monkeypatch
):
    log_dir = tmp_path / "run"
    online_run(name, log_dir, demos)
    before = files_under(log_dir)
    assert progress_rows(log_dir)
    records = tmp_path / "sacred"
    recorded_under(ONLINE[name], records, monkeypatch)
    with pytest.raises(
        ValueError,
        match=rf"^logging\.log_dir='{log_dir}' holds an earlier run \(log/log\.txt, "
        rf"log/progress\.csv, .*\), which a new run would overwrite: pass "
        rf"resume_from='{log_dir}' to continue it, or give another logging\.log_dir$",
    ):
        online_run(name, log_dir, demos)
    assert files_under(log_dir) == before
    assert run_records(records) == []
    # A resume into it goes on (here with nothing left to train), keeping its logs.
    trust = {"trust_pickle": True} if name == "gail" else {}  # its replay buffer
    online_run(name, log_dir, demos, resume_from=str(log_dir), **trust)
    assert (log_dir / "log" / "log.txt").read_bytes().startswith(before["log/log.txt"])


def test_a_fresh_run_into_an_earlier_run_is_refused(
    tmp_path, preferences_path, finished_run, recorded
):
    log_dir, state = finished_run
    before = files_under(log_dir)
    with pytest.raises(
        ValueError,
        match=rf"^logging\.log_dir='{log_dir}' holds an earlier run \(log/log\.txt, "
        rf"log/progress\.csv, .*checkpoints/\), which a new run would overwrite: "
        rf"pass resume_from='{state}' to continue it, or give another "
        r"logging\.log_dir$",
    ):
        run(log_dir.parent, preferences_path, **CSV_AND_LOG)
    assert files_under(log_dir) == before
    assert not recorded.exists()
    # Without logs, a checkpoint alone is an earlier run (here not resumable).
    quiet = {"logging.log_format_strs": [], "checkpoint_interval": -1}
    run(tmp_path, preferences_path, "quiet", **quiet)
    with pytest.raises(
        ValueError,
        match=r"holds an earlier run \(checkpoints/\), which a new run would "
        r"overwrite: give another logging\.log_dir$",
    ):
        run(tmp_path, preferences_path, "quiet", **quiet)
    # An empty lock file (a run refused before it logged) is no earlier run.
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / experiment.LOCK_NAME).touch()
    run(tmp_path, preferences_path, "locked")


# --- item: a stop signal always stops ---------------------------------------


@pytest.fixture
def stop_on_sigterm():
    previous = signal.getsignal(signal.SIGTERM)
    experiment.stop_on_signals()
    yield
    signal.signal(signal.SIGTERM, previous)
    experiment._received_signals.clear()


def test_a_swallowed_sigterm_stops_the_run_before_training(
    tmp_path, preferences_path, monkeypatch, stop_on_sigterm
):
    """SIGTERM arriving inside sacred's bare ``except`` (``is_different``)."""
    sent = []

    class SignallingNumpy:
        # numpy as sacred's is_different sees it: the first asarray is signalled.
        def __getattr__(self, name):
            return getattr(np, name)

        def asarray(self, *args, **kwargs):
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)  # handled here, in the try
            return np.asarray(*args, **kwargs)

    optional = types.SimpleNamespace(has_numpy=True, np=SignallingNumpy())
    monkeypatch.setattr(custom_containers, "opt", optional)
    with pytest.raises(SystemExit) as raised:
        run(tmp_path, preferences_path)
    assert sent and raised.value.code == 128 + signal.SIGTERM
    # Swallowed where it was raised, it ended the run at the first safe point.
    assert raised.traceback[-1].name == "exit_if_stopped"
    assert not (tmp_path / "run").exists()


_TRAIN = [sys.executable, "-m", "imitation_accum.scripts.train_reward_model", "with"]


def _sigterm_when(
    tmp_path, preferences_path, name: str, ready, signum=signal.SIGTERM, errors=None
) -> tuple:
    # Starts a run, sends SIGTERM once ``ready(line, log_dir)``; (rc, log_dir).
    # ``errors``: a list that gets stderr's lines after the signal.
    log_dir = tmp_path / name
    child = subprocess.Popen(
        [
            *_TRAIN,
            "fast",
            f"dataset_path={preferences_path}",
            "trust_pickle=True",
            f"logging.log_dir={log_dir}",
            "reward_trainer_kwargs.epochs=1000",
        ],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in child.stderr:
            if ready(line, log_dir):
                child.send_signal(signum)
                break
        rest = child.stderr.read()
        if errors is not None:
            errors.extend(rest.splitlines())
        return child.wait(timeout=300), log_dir
    finally:
        child.kill()


@pytest.mark.expensive
def test_sigterm_ends_the_script_with_143_and_a_loadable_checkpoint(
    tmp_path, preferences_path
):
    # Before the first epoch: once sacred starts the command.
    rc, log_dir = _sigterm_when(
        tmp_path, preferences_path, "early", lambda line, _: "Running command" in line
    )
    assert rc == 128 + signal.SIGTERM
    assert not (log_dir / "checkpoints").exists()
    # During training: after the first checkpoints (the progress bar is off, so
    # the epochs' lines come from the logger).
    state_path = pathlib.Path("checkpoints") / "training_state.pt"
    rc, log_dir = _sigterm_when(
        tmp_path,
        preferences_path,
        "late",
        lambda line, log_dir: (log_dir / state_path).exists(),
    )
    assert rc == 128 + signal.SIGTERM
    assert checkpoint.load_training_state(log_dir / state_path).epoch >= 1
    assert checkpoint.remove_stale_temporaries(log_dir / state_path) == []


@pytest.mark.expensive
def test_ctrl_c_says_which_checkpoint_is_intact_and_how_to_resume(
    tmp_path, preferences_path
):
    state_path = pathlib.Path("checkpoints") / "training_state.pt"
    errors: list = []
    rc, log_dir = _sigterm_when(
        tmp_path,
        preferences_path,
        "interrupted",
        lambda line, log_dir: (log_dir / state_path).exists(),
        signum=signal.SIGINT,
        errors=errors,
    )
    assert rc == 128 + signal.SIGINT
    assert errors[-1].startswith(
        f"Interrupted; checkpoint {log_dir / state_path} is intact. Continue with: "
        "python -m imitation_accum.scripts.train_reward_model with fast "
    )
    assert errors[-1].endswith(f"resume_from={log_dir / state_path}")


# --- item: the sacred record starts after the checks; config.json ------------


@pytest.fixture
def recorded(tmp_path):
    observer = experiment.RecordAfterChecks(str(tmp_path / "sacred"))
    ex.observers.append(observer)
    yield tmp_path / "sacred"
    ex.observers.remove(observer)


def test_refused_data_leaves_no_sacred_record(tmp_path, preferences_path, recorded):
    with pytest.raises(ValueError, match="trust_pickle=True"):
        run(tmp_path, preferences_path, trust_pickle=False)
    with pytest.raises(ValueError, match="fewer than one batch"):
        run(tmp_path, preferences_path, **{"reward_trainer_kwargs.batch_size": 31})
    with pytest.raises(ValueError, match="memory_budget=100 B"):
        run(tmp_path, preferences_path, **{"reward_trainer_kwargs.memory_budget": 100})
    assert not recorded.exists() and not (tmp_path / "run").exists()
    run(tmp_path, preferences_path)
    (record,) = [p for p in recorded.iterdir() if p.name != "_sources"]
    assert json.loads((record / "run.json").read_text())["status"] == "COMPLETED"
    log_dir = tmp_path / "run"
    assert (log_dir / "sacred").resolve() == record.resolve()
    config = json.loads((log_dir / "config.json").read_text())
    assert config["dataset_path"] == str(preferences_path)
    assert config["reward_trainer_kwargs"]["batch_size"] == 4
    assert not list(log_dir.glob(".*partial"))


def test_interrupted_line_names_the_intact_checkpoint_and_the_resume_command(
    tmp_path,
):
    from imitation_accum.io import run_checkpoint

    argv = [
        "/x/imitation_accum/scripts/train_preference_comparisons.py",
        "with",
        "seals_cartpole",
        "total_timesteps=2000",
    ]
    ex = types.SimpleNamespace(run_directory=None)
    line = experiment.interrupted_line(ex, argv)
    assert line.startswith("Interrupted before the run began")
    run_dir = tmp_path / "run dir"
    ex.run_directory = run_dir
    line = experiment.interrupted_line(ex, argv)
    assert "holds nothing to resume" in line
    for count in (1, 2):
        checkpoint = run_checkpoint.root(run_dir) / f"{count:06d}"
        checkpoint.mkdir(parents=True)
        (checkpoint / run_checkpoint.MANIFEST).write_text("{}")
    (run_checkpoint.root(run_dir) / "000003").mkdir()  # partial: no manifest
    line = experiment.interrupted_line(ex, [*argv, "resume_from=old"])
    assert "\n" not in line
    assert f"checkpoint {run_checkpoint.root(run_dir) / '000002'} is intact" in line
    assert line.endswith(
        "Continue with: python -m imitation_accum.scripts.train_preference_comparisons"
        f" with seals_cartpole total_timesteps=2000 'resume_from={run_dir}'"
    )
    # An AIRL/GAIL checkpoint holds its replay buffer as a pickle: the command
    # resumes it with trust_pickle=True, which the resume otherwise refuses.
    (run_checkpoint.root(run_dir) / "000002" / "replay_buffer.pkl").write_bytes(b"")
    line = experiment.interrupted_line(ex, argv)
    assert line.endswith(f" trust_pickle=True 'resume_from={run_dir}'")


_WORKER_SIGINT = """
import multiprocessing, signal
from imitation_accum.scripts import experiment

if __name__ == "__main__":
    if IGNORE:
        experiment.workers_ignore_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with multiprocessing.get_context("forkserver").Pool(1) as pool:
        print(pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN)
"""


@pytest.mark.parametrize("ignore", [True, False])
def test_environment_workers_leave_ctrl_c_to_the_main_process(tmp_path, ignore):
    # SubprocVecEnv's workers come from the forkserver: with it started by the
    # command line, a Ctrl-C prints no traceback from each of them.
    script = tmp_path / "workers.py"
    script.write_text(_WORKER_SIGINT.replace("IGNORE", str(ignore)))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(ignore)]
