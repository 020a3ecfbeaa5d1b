"""Freed host memory kept for reuse while a reward net trains on the CPU."""

import subprocess
import sys
import textwrap

import pytest
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet
from imitation.util import logger as imit_logger

from imitation_accum import Acceleration
from imitation_accum.engine import acceleration as acceleration_module
from imitation_accum.engine import host_memory
from tests import reference as ref
from tests.test_preference_exactness import make_trainer


class FakeLibc:
    """Records ``mallopt`` calls in place of glibc."""

    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return 1


@pytest.fixture
def fake_libc(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(host_memory, "_libc", libc)
    monkeypatch.setattr(host_memory, "_looked_up", True)
    for name in host_memory.TUNING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return libc


def test_thresholds_raised_inside_and_lowered_after(fake_libc):
    with host_memory.kept_for_reuse() as tuned:
        assert tuned
        assert fake_libc.calls == [
            (host_memory.M_MMAP_THRESHOLD, 32 * 2**20),
            (host_memory.M_TRIM_THRESHOLD, 2**31 - 1),
        ]
    assert fake_libc.calls[-1] == (host_memory.M_TRIM_THRESHOLD, 64 * 2**20)
    assert len(fake_libc.calls) == 3


def test_lowered_after_an_error_too(fake_libc):
    with pytest.raises(RuntimeError), host_memory.kept_for_reuse():
        raise RuntimeError("mid-step")
    assert fake_libc.calls[-1] == (host_memory.M_TRIM_THRESHOLD, 64 * 2**20)


@pytest.mark.parametrize("variable", host_memory.TUNING_VARIABLES)
def test_left_alone_where_the_environment_tunes_malloc(
    fake_libc, monkeypatch, variable
):
    monkeypatch.setenv(variable, "1048576")
    with host_memory.kept_for_reuse() as tuned:
        assert not tuned
    assert fake_libc.calls == []


def test_opt_out_and_other_c_libraries(fake_libc, monkeypatch):
    with host_memory.kept_for_reuse(enabled=False) as tuned:
        assert not tuned
    monkeypatch.setattr(host_memory, "_libc", None)
    with host_memory.kept_for_reuse() as tuned:
        assert not tuned
    assert fake_libc.calls == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_real_glibc_accepts_the_values():
    # A fresh process: mallopt returns 1 when it takes a value.
    code = textwrap.dedent(
        """
        from imitation_accum.engine import host_memory as h
        libc = h.glibc()
        assert libc is not None
        print(libc.mallopt(h.M_MMAP_THRESHOLD, h.MMAP_THRESHOLD_BYTES),
              libc.mallopt(h.M_TRIM_THRESHOLD, h.TRAINING_TRIM_THRESHOLD_BYTES),
              libc.mallopt(h.M_TRIM_THRESHOLD, h.RESTING_TRIM_THRESHOLD_BYTES))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["1", "1", "1"]


@pytest.mark.parametrize("reuse", [True, False])
def test_trainer_keeps_memory_while_training_on_cpu(rng, monkeypatch, reuse):
    entered = []
    real = host_memory.kept_for_reuse

    def recording(enabled=True):
        entered.append(enabled)
        return real(enabled=False)

    monkeypatch.setattr(host_memory, "kept_for_reuse", recording)
    dataset = ref.make_dataset(rng, 4, (3, 3))
    net = BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE)
    trainer = make_trainer(
        net,
        batch_size=4,
        minibatch_size=2,
        custom_logger=imit_logger.configure(format_strs=[]),
        acceleration=Acceleration(reuse_host_memory=reuse),
    )
    trainer.train(dataset)
    trainer.train(dataset)
    assert entered == ([True, True] if reuse else [])


def test_not_for_a_net_off_the_cpu(monkeypatch):
    net = BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE)
    monkeypatch.setattr(acceleration_module, "_on_cpu", lambda module: False)
    assert isinstance(
        acceleration_module.maybe_applied(Acceleration(), net),
        type(acceleration_module.contextlib.nullcontext()),
    )
    monkeypatch.undo()
    assert acceleration_module._on_cpu(net)
    assert acceleration_module._on_cpu(th.nn.Module())  # no parameters


def test_option_parsed_from_a_config_mapping():
    assert Acceleration().reuse_host_memory
    assert not Acceleration().any  # the off-by-default options
    parsed = Acceleration.parse({"reuse_host_memory": False})
    assert parsed == Acceleration(reuse_host_memory=False)
    with pytest.raises(ValueError, match=r"acceleration\.reuse_host_memory must be"):
        Acceleration.parse({"reuse_host_memory": "no"})
