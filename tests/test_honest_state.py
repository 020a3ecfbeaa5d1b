"""Resumes and failures that leave exactly the state they say they leave."""

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch as th

from imitation_accum import checkpoint
from imitation_accum.io import atomic
from tests import reference as ref
from tests.test_checkpoint import make_net, make_trainer

# --- SIGTERM while a checkpoint is written ----------------------------------

_SIGTERM_DURING_WRITE = """
import os, signal, sys
import torch
from imitation_accum.io import atomic
signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
where = {where!r}
original_temporary, original_save = atomic._make_temporary, atomic.th.save
def temporary(target):
    made = original_temporary(target)
    if where == "after_create":  # before the write's cleanup could run
        os.kill(os.getpid(), signal.SIGTERM)
    return made
def save(obj, file):
    original_save(obj, file)
    if where == "mid_write":  # written, not yet renamed
        os.kill(os.getpid(), signal.SIGTERM)
atomic._make_temporary, atomic.th.save = temporary, save
atomic.atomic_save({{"epoch": 2}}, {path!r})
print("not stopped")
"""


@pytest.mark.parametrize("where", ["after_create", "mid_write"])
def test_sigterm_during_a_write_waits_for_it_and_leaves_no_partial(tmp_path, where):
    path = tmp_path / "state.pt"
    atomic.atomic_save({"epoch": 1}, path)
    code = _SIGTERM_DURING_WRITE.format(where=where, path=str(path))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
    )
    # The handler ran (exit 128 + 15) once the write was whole, not before.
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-2000:]
    assert "not stopped" not in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]
    assert th.load(path) == {"epoch": 2}


def test_signal_handlers_are_restored_after_a_write(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    atomic.atomic_save({"a": 1}, tmp_path / "a.pt")
    assert signal.getsignal(signal.SIGTERM) is before


# --- the generator after a failed first step of an epoch --------------------


def test_failure_in_an_epochs_first_step_rewinds_the_generator(monkeypatch):
    dataset = ref.make_dataset(np.random.default_rng(5), 10, (3, 4))
    trainer = make_trainer(make_net(), epochs=2)  # 10 pairs by 4: 3 steps an epoch
    original = type(trainer)._train_step
    calls, after_step = [0], []

    def step(self, table, batch):
        calls[0] += 1
        if calls[0] == 4:  # the second epoch's first step
            raise FloatingPointError("injected")
        result = original(self, table, batch)
        after_step.append(dict(self.rng.bit_generator.state["state"]))
        return result

    monkeypatch.setattr(type(trainer), "_train_step", step)
    with pytest.raises(FloatingPointError):
        trainer.train(dataset)
    # As after the last completed step: the second epoch's permutation undrawn.
    assert dict(trainer.rng.bit_generator.state["state"]) == after_step[-1]


def test_failure_later_in_an_epoch_keeps_its_permutation(monkeypatch):
    dataset = ref.make_dataset(np.random.default_rng(5), 10, (3, 4))
    trainer = make_trainer(make_net(), epochs=2)
    original = type(trainer)._train_step
    calls, after_step = [0], []

    def step(self, table, batch):
        calls[0] += 1
        if calls[0] == 5:  # the second epoch's second step
            raise FloatingPointError("injected")
        result = original(self, table, batch)
        after_step.append(dict(self.rng.bit_generator.state["state"]))
        return result

    monkeypatch.setattr(type(trainer), "_train_step", step)
    with pytest.raises(FloatingPointError):
        trainer.train(dataset)
    assert dict(trainer.rng.bit_generator.state["state"]) == after_step[-1]
    assert after_step[-1] != after_step[2]  # the permutation was drawn after step 3


# --- the optimizer's hyperparameters on resume ------------------------------


def test_configured_hyperparameters_replace_the_checkpoints():
    trainer = make_trainer(make_net(), lr=0.01)
    state = checkpoint.capture_state(trainer, epoch=1)
    resumed = make_trainer(make_net(), lr=0.05)
    checkpoint.restore_state(resumed, state, "state.pt")
    assert resumed.optim.param_groups[0]["lr"] == 0.01  # what loading does
    changed = checkpoint.apply_hyperparameters(
        resumed.optim, {"lr": 0.05, "betas": [0.5, 0.9], "weight_decay": 0.01}
    )
    assert changed == {"lr": (0.01, 0.05), "betas": ((0.9, 0.999), [0.5, 0.9])}
    group = resumed.optim.param_groups[0]
    assert group["lr"] == 0.05 and group["betas"] == (0.5, 0.9)


# --- CUDA generators ----------------------------------------------------------


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs CUDA")
def test_cuda_generators_saved_and_restored(tmp_path):
    trainer = make_trainer(make_net())
    th.cuda.manual_seed_all(3)
    state = checkpoint.capture_state(trainer, epoch=1)
    expected = th.rand(4, device="cuda")
    path = checkpoint.save_training_state(state, tmp_path / "state.pt")
    th.cuda.manual_seed_all(99)
    checkpoint.restore_state(trainer, checkpoint.load_training_state(path), path)
    assert th.equal(th.rand(4, device="cuda"), expected)


def test_state_without_cuda_generators_still_loads(tmp_path):
    trainer = make_trainer(make_net())
    state = checkpoint.capture_state(trainer, epoch=1)
    assert state.cuda_rng_states is None or th.cuda.is_available()
    path = tmp_path / "old.pt"
    payload = {"format": "imitation_accum.training_state", "version": 1}
    fields = dict(vars(state))
    del fields["cuda_rng_states"]  # as written before CUDA states were kept
    th.save({**payload, **fields}, path)
    assert checkpoint.load_training_state(path).cuda_rng_states is None
