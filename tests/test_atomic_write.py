"""A checkpoint write that runs out of disk names the file and keeps the old one."""

import errno
import resource
import subprocess
import sys
import textwrap

import pytest
import torch as th

from imitation_accum import checkpoint
from imitation_accum.io import atomic


def test_a_full_disk_is_named_and_the_previous_checkpoint_loads(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "training_state.pt"
    atomic.atomic_save({"step": th.tensor(1)}, path)

    def disk_full(file):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "fsync_file", disk_full)
    with pytest.raises(atomic.AtomicWriteError) as raised:
        atomic.atomic_save({"step": th.tensor(2)}, path)
    message = str(raised.value)
    assert repr(str(path)) in message
    assert "the disk is full" in message
    assert "the previous training_state.pt is intact" in message
    assert th.load(path)["step"].item() == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["training_state.pt"]


def test_a_first_write_that_fails_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "net.pt"

    def disk_full(file):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "fsync_file", disk_full)
    with pytest.raises(atomic.AtomicWriteError, match="no partial file was left"):
        atomic.atomic_save({"x": 1}, path)
    assert list(tmp_path.iterdir()) == []


def test_other_errors_of_the_writer_pass_unchanged(tmp_path):
    def fails(file):
        raise RuntimeError("not a write error")

    with pytest.raises(RuntimeError, match=r"^not a write error$"):
        atomic.atomic_write(tmp_path / "x", fails)
    assert list(tmp_path.iterdir()) == []


_SAVE_LARGE = """
import sys
import torch as th
from imitation_accum.io import atomic
try:
    atomic.atomic_save({"step": th.zeros(1 << 20)}, sys.argv[1])
except atomic.AtomicWriteError as error:
    print(error)
    sys.exit(3)
"""


def _limit_file_size() -> None:
    # Files of at most 64 KiB: torch's writer then fails ("unexpected pos").
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))


def test_a_file_size_limit_is_named_and_the_previous_checkpoint_loads(tmp_path):
    """A real short write (as on a full disk): torch's own error, rephrased."""
    path = tmp_path / "training_state.pt"
    atomic.atomic_save({"step": th.tensor(1)}, path)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SAVE_LARGE), str(path)],
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"could not write {str(path)!r}" in done.stdout
    assert "the previous training_state.pt is intact" in done.stdout
    assert th.load(path)["step"].item() == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["training_state.pt"]
    assert checkpoint.remove_stale_temporaries(path) == []
