"""Freed host memory kept for reuse while a reward net trains on the CPU."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch as th

from imitation_accum import Acceleration
from imitation_accum.engine import host_memory


def _has_mallinfo2():
    libc = host_memory.glibc()
    return libc is not None and hasattr(libc, "mallinfo2")  # glibc >= 2.33


@pytest.fixture(scope="module")
def readings():
    """What ``free`` did in a fresh process (see tests/host_memory_probe.py).

    Each reading is whether ~160 MiB of freed heap blocks stayed at the top of
    glibc's heap (trim threshold raised) or went back to the kernel.
    """
    if not _has_mallinfo2():
        pytest.skip("glibc >= 2.33 only (mallinfo2)")
    env = {k: v for k, v in os.environ.items() if k not in host_memory.TUNING_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-m", "tests.host_memory_probe"],
        cwd=pathlib.Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_thresholds_raised_while_a_cpu_net_trains_and_lowered_after(readings):
    assert readings["before"] is False
    for run in ("train", "train_again"):
        # Every forward of the net, from the first to the last, ran with the
        # heap's top kept; after train() it goes back to the kernel again.
        assert readings[run], run
        assert all(readings[run]), (run, readings[run])
        assert readings[f"after_{run}"] is False, run


def test_lowered_after_a_step_that_raises(readings):
    assert readings["train_failing"] == [True]
    assert readings["after_train_failing"] is False


def test_opt_out_leaves_malloc_alone(readings):
    assert readings["train_opted_out"]
    assert not any(readings["train_opted_out"])


@pytest.mark.parametrize("variable", host_memory.TUNING_VARIABLES)
def test_left_alone_where_the_environment_tunes_malloc(readings, variable):
    assert readings[f"train_with_{variable}"]
    assert not any(readings[f"train_with_{variable}"])
    assert readings[f"context_with_{variable}"] == [False, False]


def test_context_raises_inside_and_lowers_after(readings):
    assert readings["context"] == [True, True]
    assert readings["after_context"] is False
    assert readings["after_context_error"] is False
    assert readings["context_disabled"] == [False, False]


def test_nothing_with_another_c_library(monkeypatch):
    monkeypatch.setattr(host_memory, "glibc", lambda: None)
    assert not host_memory.applies()
    with host_memory.kept_for_reuse() as tuned:
        assert not tuned


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


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs CUDA")
def test_left_alone_for_a_net_on_cuda(readings):
    assert readings["train_on_cuda"]
    assert not any(readings["train_on_cuda"])


def test_applied_for_a_net_on_the_cpu_only(readings):
    assert readings["applied_cpu_net"] is True
    assert readings["applied_parameterless_net"] is True
    assert readings["applied_meta_net"] is False
    for net in ("cpu_net", "parameterless_net", "meta_net"):
        assert readings[f"applied_opted_out_{net}"] is False, net


def test_option_parsed_from_a_config_mapping():
    assert Acceleration().reuse_host_memory
    assert not Acceleration().any  # the off-by-default options
    parsed = Acceleration.parse({"reuse_host_memory": False})
    assert parsed == Acceleration(reuse_host_memory=False)
    with pytest.raises(TypeError, match=r"acceleration\.reuse_host_memory must be"):
        Acceleration.parse({"reuse_host_memory": "no"})
