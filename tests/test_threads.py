"""Intra-op threads of the trainers' calls: a pure rule, set only while steps run.

The trainers pick the threads of their reward-net calls from the memory probe's
bytes and the cores (``planning.threads``), set them for each step and give the
caller's back afterwards, also after an error; a user's own choice (the
environment, ``torch.set_num_threads``) wins. Tests that need the policy to act
make the caller's count PyTorch's default and fix the cores, so that they hold on
any machine and after other tests changed the count.
"""

import os
import subprocess
import sys
from typing import List

import numpy as np
import pytest
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet

from imitation_accum import GAIL
from imitation_accum.planning import plan as planning
from imitation_accum.planning import threads
from tests import adversarial_setup as setup
from tests import reference as ref
from tests.test_memory_oom import OutOfMemoryAbove
from tests.test_preference_exactness import make_net, make_trainer

#: The caller's intra-op threads in these tests (taken for PyTorch's default).
CALLER = 3
#: The cores the policy is given.
CORES = 4


@pytest.fixture
def caller_threads():
    """The test runs with :data:`CALLER` threads; the previous count comes back."""
    before = th.get_num_threads()
    th.set_num_threads(CALLER)
    yield CALLER
    th.set_num_threads(before)


@pytest.fixture
def policy_acts(monkeypatch, caller_threads):
    """No explicit choice: no variables, the caller's count is PyTorch's default."""
    for name in threads.ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "torch_default_threads", lambda: caller_threads)
    monkeypatch.setattr(threads, "usable_cores", lambda: CORES)


def recording_counts(net: th.nn.Module) -> List[int]:
    """``torch.get_num_threads()`` at each call of ``net`` (appended to the list)."""
    counts: List[int] = []
    net.register_forward_pre_hook(
        lambda module, args: counts.append(th.get_num_threads())
    )
    return counts


# The rule -----------------------------------------------------------------------


def test_threads_are_a_pure_function_of_work_and_cores(monkeypatch, caller_threads):
    unit = threads.CALL_BYTES_PER_THREAD
    cases = [
        ((0, 4), 1),
        ((unit - 1, 4), 1),
        ((2 * unit - 1, 4), 1),
        ((2 * unit, 4), 2),
        ((3.5 * unit, 4), 3),
        ((100 * unit, 4), 4),
        ((100 * unit, 1), 1),
    ]
    first = [threads.intra_op_threads(*args) for args, _ in cases]
    assert first == [expected for _, expected in cases]
    # Neither the current count nor the environment enters the rule.
    th.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert [threads.intra_op_threads(*args) for args, _ in cases] == first
    policy = threads.ThreadPolicy(
        bytes_per_transition=1000.0, bytes_per_call=5.0, cores=4
    )
    for n in (1, 100, unit // 1000, 10 * unit // 1000):
        assert policy.threads(n) == threads.intra_op_threads(1000.0 * n + 5.0, 4)
    assert policy.threads(0) == 1
    for bad in ((1.0, 0), (-1.0, 2), (float("nan"), 2)):
        with pytest.raises(ValueError, match=r"cores|call_bytes"):
            threads.intra_op_threads(*bad)


def test_a_plan_names_the_threads_of_its_largest_call():
    policy = threads.ThreadPolicy(threads.CALL_BYTES_PER_THREAD, 0.0, cores=8)
    lengths = np.array([[5, 3], [4, 6], [7, 7]])  # pairs: transitions per side
    plan = planning.plan_step(
        lengths, planning.StepPolicy(minibatch_size=2, forward_size=20, threads=policy)
    )
    # Chunks of two pairs: sides of 9 and 9, then 7 and 7; calls of the whole side.
    assert plan.largest_call == 9
    assert plan.threads == policy.threads(9) == 8
    small = planning.plan_step(
        lengths, planning.StepPolicy(minibatch_size=2, forward_size=4, threads=policy)
    )
    assert small.largest_call == 4 and small.threads == policy.threads(4) == 4
    two = planning.plan_step(
        lengths, planning.StepPolicy(forward_size=3, two_pass=True, threads=policy)
    )
    assert two.largest_call == 3 and two.threads == 3
    assert planning.plan_step(lengths, planning.StepPolicy()).threads is None


# The user's choice --------------------------------------------------------------


def test_torch_default_threads_is_what_a_fresh_pytorch_starts_with():
    env = {
        k: v for k, v in os.environ.items() if k not in threads.ENVIRONMENT_VARIABLES
    }
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert threads.torch_default_threads() == int(fresh.stdout)


def test_an_explicit_choice_is_detected(monkeypatch, caller_threads):
    for name in threads.ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    default = threads.torch_default_threads()
    th.set_num_threads(default)
    assert threads.explicit_choice() is None
    for name in threads.ENVIRONMENT_VARIABLES:
        monkeypatch.setenv(name, " ")  # empty: PyTorch ignores it too
        assert threads.explicit_choice() is None
        monkeypatch.setenv(name, str(default))  # even the default count
        assert name in (threads.explicit_choice() or "")
        monkeypatch.delenv(name)
    th.set_num_threads(default + 1)
    assert "torch.set_num_threads" in (threads.explicit_choice() or "")


def test_an_explicit_choice_wins_in_training(monkeypatch, rng, caller_threads):
    monkeypatch.setattr(threads, "torch_default_threads", lambda: caller_threads)
    monkeypatch.setattr(threads, "usable_cores", lambda: CORES)
    monkeypatch.setenv("OMP_NUM_THREADS", str(caller_threads))
    net = make_net()
    counts = recording_counts(net)
    trainer = make_trainer(net, batch_size=4, minibatch_size=2)
    trainer.train(ref.make_dataset(rng, 8, (5,)))
    assert trainer.step_policy.threads is None and trainer.last_plan.threads is None
    assert counts and set(counts) == {caller_threads}
    logged = trainer.logger.name_to_value["reward/final/train/intra_op_threads"]
    assert logged == caller_threads


# The trainers -------------------------------------------------------------------


def test_preference_steps_run_at_the_policy_threads_and_restore(rng, policy_acts):
    net = make_net()
    counts = recording_counts(net)
    trainer = make_trainer(net, batch_size=4, minibatch_size=2)
    trainer.train(ref.make_dataset(rng, 8, (5,)))
    plan = trainer.last_plan
    profile = trainer.memory_profile
    expected = threads.ThreadPolicy.of(profile).threads(plan.largest_call)
    assert expected == 1  # a small MLP's calls: one thread
    assert plan.threads == expected
    assert th.get_num_threads() == CALLER
    # The probe's calls run before the steps, at the caller's count.
    n_probe = counts.index(expected)
    assert n_probe > 0 and set(counts[:n_probe]) == {CALLER}
    assert set(counts[n_probe:]) == {expected}
    logged = trainer.logger.name_to_value["reward/final/train/intra_op_threads"]
    assert logged == expected


def test_a_large_call_gets_every_core(rng, monkeypatch, policy_acts):
    monkeypatch.setattr(threads, "CALL_BYTES_PER_THREAD", 1)
    net = make_net()
    counts = recording_counts(net)
    trainer = make_trainer(net, batch_size=4, minibatch_size=2, forward_size=3)
    trainer.train(ref.make_dataset(rng, 8, (5,)))
    assert trainer.last_plan.threads == CORES
    assert counts[-1] == CORES and th.get_num_threads() == CALLER


def test_threads_come_back_after_a_failing_step(rng, policy_acts):
    net = make_net()
    trainer = make_trainer(net, batch_size=4, minibatch_size=2)
    dataset = ref.make_dataset(rng, 8, (5,))
    trainer.train(dataset)
    seen: List[int] = []

    def fail(module, args):
        if th.is_grad_enabled():
            seen.append(th.get_num_threads())
            raise RuntimeError("failing call")

    handle = net.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="failing call"):
        trainer.train(dataset)
    handle.remove()
    assert seen == [1] and th.get_num_threads() == CALLER


def test_a_redone_step_runs_at_its_new_plans_threads_and_restores(
    monkeypatch, policy_acts
):
    eight_cores = threads.ThreadPolicy(threads.CALL_BYTES_PER_THREAD, 0.0, cores=8)
    monkeypatch.setattr(
        threads.ThreadPolicy, "of", classmethod(lambda cls, profile: eight_cores)
    )
    th.manual_seed(0)
    net = OutOfMemoryAbove(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=(16,), limit=99)
    trainer = make_trainer(net, batch_size=2, forward_size=100)
    dataset = ref.make_dataset(np.random.default_rng(0), 2, (5, 3))
    trainer.train(dataset)  # probes once (cached), at any size
    seen: List[int] = []
    net.register_forward_pre_hook(
        lambda module, args: (
            seen.append(th.get_num_threads()) if th.is_grad_enabled() else None
        )
    )
    net.limit = 6
    trainer.train(dataset)
    # Calls of 10 (first sides) and 6 transitions: 8 threads, out of memory; redone
    # in chunks of one pair, calls of 5 and 3 transitions: 5 threads.
    assert net.raised == 1 and trainer.step_policy.chunk_cap == 8
    assert seen == [8, 5, 5, 5, 5] and trainer.last_plan.threads == 5
    assert th.get_num_threads() == CALLER


def test_discriminator_steps_run_at_the_policy_threads_and_restore(rng, policy_acts):
    venv = setup.make_venv("CartPole-v1")
    net = BasicRewardNet(venv.observation_space, venv.action_space)
    trainer = setup.make_trainer(
        GAIL,
        net,
        venv=venv,
        gen_algo=setup.small_ppo(venv),
        demo_batch_size=16,
        demo_minibatch_size=8,
        copy_net=False,
    )
    counts = recording_counts(net)
    expert = setup.random_samples(rng, 16, venv)
    generated = setup.random_samples(rng, 16, venv)
    trainer.train_disc(expert_samples=expert, gen_samples=generated)
    policy = trainer.step_policy.threads
    assert policy is not None and policy.cores == CORES
    assert counts[-1] == policy.threads(8) == 1
    assert th.get_num_threads() == CALLER


# Determinism --------------------------------------------------------------------


def test_two_runs_are_bit_identical(policy_acts):
    def run() -> List[th.Tensor]:
        th.manual_seed(0)
        net = make_net()
        trainer = make_trainer(net, batch_size=4, minibatch_size=3, epochs=2)
        trainer.train(ref.make_dataset(np.random.default_rng(0), 10, (5, 7)))
        assert trainer.last_plan.threads == 1  # not the caller's
        return [p.detach().clone() for p in net.parameters()]

    first, second = run(), run()
    assert all(th.equal(a, b) for a, b in zip(first, second))
