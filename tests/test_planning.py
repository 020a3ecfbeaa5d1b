"""Planning a step: the policy is plain data, the plan a pure function of it.

The default forward size comes from the memory probe, so runs with the same
seed are bit-identical; settings assigned after construction take effect at the
next ``train()``, as in imitation.
"""

import copy

import numpy as np
import pytest
import torch as th
from imitation.util import logger as imit_logger

from imitation_accum.planning import plan as planning
from imitation_accum.planning import probe
from imitation_accum.preference import arguments, pair_table
from tests import reference as ref
from tests.test_preference_exactness import TOL, make_net, make_trainer


@pytest.mark.parametrize("n_items", [1, 7, 12])
@pytest.mark.parametrize("minibatch_size", [None, 1, 5, 12])
def test_chunks_cover_the_batch_in_order(n_items, minibatch_size):
    chunks = planning.plan_chunks(n_items, minibatch_size)
    covered = [i for s in chunks for i in range(n_items)[s]]
    assert covered == list(range(n_items))
    assert all(s.stop - s.start == (minibatch_size or n_items) for s in chunks[:-1])


def profile_of(device_type, saved, transient):
    return probe.ActivationProfile(device_type, 0, saved, 0.0, transient)


@pytest.mark.parametrize(
    "saved, transient, expected",
    [
        (1.0, 1.0, probe.CPU_CALL_BYTES // 2),  # an MLP: as large as the chunk
        (probe.CPU_CALL_BYTES / 8, probe.CPU_CALL_BYTES / 8, 4),
        (probe.CPU_CALL_BYTES / 6, probe.CPU_CALL_BYTES / 6, 3),
        (probe.CPU_CALL_BYTES, probe.CPU_CALL_BYTES, 1),  # never below one
    ],
)
def test_cpu_calls_hold_what_fits_the_call_bytes(saved, transient, expected):
    assert profile_of("cpu", saved, transient).forward_size() == expected


def test_cuda_calls_span_the_chunk():
    assert profile_of("cuda", 1e9, 1e9).forward_size() is None
    policy = planning.StepPolicy(chunk_cap=7)
    assert policy.forward_size_within(20) == 7  # the memory cap bounds a whole call
    assert planning.StepPolicy().forward_size_within(20) == 20


def train_default(dataset, call_bytes, monkeypatch, **kwargs):
    monkeypatch.setattr(probe, "CPU_CALL_BYTES", call_bytes)
    net = make_net()
    initial = copy.deepcopy(net)
    trainer = make_trainer(net, batch_size=len(dataset), minibatch_size=2, **kwargs)
    trainer.train(dataset)
    return initial, net, trainer


def test_default_forward_size_comes_from_the_probe_and_is_exact(rng, monkeypatch):
    dataset = ref.make_dataset(rng, 5, (6,))
    prober = make_trainer(make_net(), batch_size=5)
    prober._task.refresh_device()
    profile = prober._profile(pair_table.read_preferences(dataset))
    per_transition = profile.saved_per_transition + profile.transient_per_transition
    # The bytes of three and a half transitions' activations: calls of three.
    initial, net, trainer = train_default(
        dataset, int(3.5 * per_transition), monkeypatch
    )
    assert trainer.last_plan.forward_size == 3
    assert trainer.logger.name_to_value["reward/final/train/forward_size"] == 3
    pairs, prefs = ref.batch_of(dataset, range(5))
    expected = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    assert ref.relative_error(ref.param_grads(net), expected) < TOL


def test_two_runs_with_the_default_forward_size_are_bit_identical(rng, monkeypatch):
    dataset = ref.make_dataset(rng, 12, (4, 6, 5))
    runs = []
    for _ in range(2):
        th.manual_seed(0)
        net = make_net()
        trainer = make_trainer(net, batch_size=5, minibatch_size=2, epochs=3)
        trainer.train(dataset)
        runs.append([p.detach().clone() for p in net.parameters()])
    for a, b in zip(*runs):
        assert th.equal(a, b)


def fresh_pair(**kwargs):
    """Two trainers of one initial net: the second is changed after construction."""
    net = make_net()
    return (
        make_trainer(copy.deepcopy(net), **kwargs),
        make_trainer(copy.deepcopy(net), batch_size=6),
    )


def params(trainer):
    return [p.detach() for p in trainer._preference_model.model.parameters()]


@pytest.mark.parametrize(
    "name, value",
    [
        ("minibatch_size", 2),
        ("epochs", 3),
        ("lr", 0.05),
        ("max_grad_norm", 0.01),
        ("batch_size", 4),
        ("forward_size", 1),
        ("two_pass", True),
        ("memory_budget", "6GiB"),
    ],
)
def test_settings_assigned_after_construction_take_effect(rng, name, value):
    dataset = ref.make_dataset(rng, 6, (3, 4))
    built, assigned = fresh_pair(**{"batch_size": 6, name: value})
    setattr(assigned, name, value)
    built.train(dataset)
    assigned.train(dataset)
    for a, b in zip(params(built), params(assigned)):
        assert th.equal(a, b)
    if name in ("minibatch_size", "two_pass", "forward_size", "memory_budget"):
        assert assigned.last_plan == built.last_plan
    assert assigned.memory_budget == built.memory_budget


def test_an_assigned_optimizer_and_logger_are_used(rng, tmp_path):
    dataset = ref.make_dataset(rng, 6, (3, 4))
    built, assigned = fresh_pair(
        batch_size=6, optimizer_cls=th.optim.SGD, optimizer_kwargs={"lr": 0.1}
    )
    assert isinstance(assigned.optim, th.optim.AdamW)
    assigned.optim = th.optim.SGD(assigned._preference_model.model.parameters(), lr=0.1)
    logger = imit_logger.configure(str(tmp_path), ["csv"])
    assigned.logger = logger
    built.train(dataset)
    before = [p.clone() for p in params(assigned)]
    assigned.train(dataset)
    for a, b in zip(params(built), params(assigned)):
        assert th.equal(a, b)
    assert any(not th.equal(a, b) for a, b in zip(before, params(assigned)))
    assert "reward/final/train/loss" in logger.name_to_value


@pytest.mark.parametrize(
    "name, value, error, match",
    [
        (
            "minibatch_size",
            7,
            ValueError,
            "minibatch_size=7 must not exceed batch_size",
        ),
        ("minibatch_size", 0, ValueError, "minibatch_size must be a positive int"),
        ("batch_size", 2.0, TypeError, "batch_size must be a positive int, got 2.0"),
        ("epochs", 0, ValueError, "epochs must be a positive int"),
        ("forward_size", "fast", ValueError, "forward_size must be a positive int or"),
        ("two_pass", "yes", TypeError, "two_pass must be None or a bool"),
        ("memory_budget", "lots", ValueError, "memory_budget='lots' does not parse"),
        ("memory_budget", [6], TypeError, "memory_budget must be bytes"),
        ("lr", -1.0, ValueError, "lr must be a finite number >= 0, got -1.0"),
        ("max_grad_norm", 0, ValueError, "max_grad_norm must be a positive finite"),
        ("drop_last", "no", TypeError, "drop_last must be a bool"),
    ],
)
def test_bad_settings_assigned_after_construction_fail_before_training(
    rng, name, value, error, match
):
    # Assignment takes anything, as imitation's attributes do; the next train()
    # parses and checks the setting as the constructor does, before any step.
    dataset = ref.make_dataset(rng, 6, (3, 4))
    trainer = make_trainer(make_net(), batch_size=6)
    before = [p.clone() for p in params(trainer)]
    setattr(trainer, name, value)
    with pytest.raises(error, match=f"^{match}"):
        trainer.train(dataset)
    for a, b in zip(before, params(trainer)):
        assert th.equal(a, b)
    with pytest.raises(error, match=f"^{match}"):  # the constructor's own check
        make_trainer(make_net(), **{"batch_size": 6, name: value})


def test_a_setting_is_checked_where_it_is_given_with_the_given_name():
    # One check of each setting: the constructor's message, prefixed in a hook's.
    with pytest.raises(ValueError) as constructed:
        make_trainer(make_net(), batch_size=4, minibatch_size=5)
    with pytest.raises(ValueError) as configured:
        arguments.TrainerSettings(
            batch_size=4, minibatch_size=5, key_prefix="reward_trainer_kwargs."
        )
    assert str(constructed.value) == "minibatch_size=5 must not exceed batch_size=4."
    assert str(configured.value) == (
        "reward_trainer_kwargs.minibatch_size=5 must not exceed "
        "reward_trainer_kwargs.batch_size=4."
    )


def test_parsed_settings_are_what_train_uses(rng):
    trainer = make_trainer(make_net(), batch_size=6, forward_size=4)
    trainer.memory_budget = "6GiB"
    trainer.max_grad_norm = np.float32(0.5)
    trainer.drop_last = np.True_
    trainer.train(ref.make_dataset(rng, 6, (3, 4)))
    assert trainer.memory_budget == 6 * 2**30
    assert type(trainer.max_grad_norm) is float and trainer.max_grad_norm == 0.5
    assert trainer.drop_last is True
