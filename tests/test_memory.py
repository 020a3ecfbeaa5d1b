"""memory_budget: parsing, the saved-bytes probe, chunk sizing, planning."""

import copy

import numpy as np
import pytest
import torch as th

from imitation_accum.planning import budget, probe
from imitation_accum.planning import plan as planning
from imitation_accum.preference import pair_table
from tests import reference as ref
from tests.test_preference_exactness import TOL, make_net, make_trainer

# Budget parsing ---------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (1000, 1000),
        ("6GiB", 6 * 2**30),
        ("500MB", 500 * 10**6),
        ("1.5 gb", 1_500_000_000),
        ("64KiB", 65536),
        ("123", 123),
        ("auto", "auto"),
        ("AUTO", "auto"),
        (2.5e9, 2_500_000_000),
        (None, None),
    ],
)
def test_budgets_parse(value, expected):
    assert budget.parse_budget(value) == expected


@pytest.mark.parametrize(
    "value", ["", "lots", "6 GiBs", "-1GB", "0", 0, -5, 0.5, float("nan")]
)
def test_bad_budgets_are_rejected_by_name(value):
    with pytest.raises(ValueError, match="memory_budget"):
        budget.parse_budget(value)


@pytest.mark.parametrize("value", [True, [1]])
def test_budgets_of_another_type_are_rejected_by_name(value):
    with pytest.raises(TypeError, match="memory_budget"):
        budget.parse_budget(value)


def test_budget_and_minibatch_size_are_alternatives():
    with pytest.raises(ValueError, match=r"minibatch_size.*memory_budget"):
        make_trainer(make_net(), batch_size=4, minibatch_size=2, memory_budget="1GiB")


@pytest.mark.parametrize("budget", ["1KB", "lots", 0])
def test_bad_or_tiny_budgets_fail_at_construction(budget):
    with pytest.raises(ValueError, match="memory_budget"):
        make_trainer(make_net(), batch_size=4, memory_budget=budget)


def test_budget_below_one_transition_fails_before_training(rng):
    dataset = ref.make_dataset(rng, 4, (5,))
    net = make_net()
    initial = copy.deepcopy(net)
    needed = budget.training_state_bytes(th.optim.AdamW(net.parameters()))
    trainer = make_trainer(net, batch_size=4, memory_budget=needed + 1024)
    with pytest.raises(ValueError, match=r"memory_budget.*too small"):
        trainer.train(dataset)
    assert ref.relative_error(list(net.parameters()), list(initial.parameters())) == 0


def test_training_state_counts_parameters_gradients_and_adam_moments():
    net = th.nn.Linear(10, 10)  # 110 float32 parameters
    optimizer = th.optim.AdamW(net.parameters())
    assert budget.training_state_bytes(optimizer) == 4 * 110 * 4
    sgd = th.optim.SGD(net.parameters(), lr=0.1)
    assert budget.training_state_bytes(sgd) == 3 * 110 * 4


def test_auto_takes_a_share_of_available_host_memory(monkeypatch):
    monkeypatch.setattr(budget, "_meminfo_available", lambda: 10 * 2**30)
    monkeypatch.setattr(budget, "_cgroup_available", lambda: None)
    resolved = budget.resolve_budget("auto", th.device("cpu"), resident_bytes=1000)
    assert resolved == int(budget.AUTO_FRACTION["cpu"] * 10 * 2**30) + 1000
    monkeypatch.setattr(budget, "_cgroup_available", lambda: 2**30)  # a container
    resolved = budget.resolve_budget("auto", th.device("cpu"), resident_bytes=0)
    assert resolved == int(budget.AUTO_FRACTION["cpu"] * 2**30)


def test_auto_budget_trains(rng):
    dataset = ref.make_dataset(rng, 4, (5,))
    trainer = make_trainer(make_net(), batch_size=4, memory_budget="auto")
    trainer.train(dataset)
    logged = trainer.logger.name_to_value
    # a whole batch fits in this machine's memory: one chunk of all 4 pairs
    assert logged["reward/final/train/chunk_transitions"] == 40
    # the logged estimate is the profile's for that chunk, in MiB
    expected = trainer.memory_profile.chunk_bytes(40, trainer.last_plan.forward_size)
    assert logged["reward/final/train/memory_estimate_mib"] == expected / 2**20


# The probe ----------------------------------------------------------------------


def test_probe_counts_the_bytes_autograd_saves():
    weight = th.nn.Parameter(th.randn(8, 16))

    def run(n):
        # matmul saves its input (n x 8), relu its output (n x 16): 96 B each row
        return th.relu(th.randn(n, 8) @ weight).sum(1)

    for n in (1, 3, 10):
        saved = probe.measure_saved_bytes(run, n, [weight], th.device("cpu"))
        assert saved.saved == 4 * (8 + 16) * n
        assert saved.largest == 4 * 16 * n
    assert weight.grad is None  # the probe's backward leaves .grad alone


def test_profile_extrapolates_linearly_and_conservatively():
    weight = th.nn.Parameter(th.randn(8, 16))

    def run(n):
        return th.relu(th.randn(n, 8) @ weight).sum(1)

    profile = probe.profile_activations(
        run,
        max_transitions=10,
        params=[weight],
        device=th.device("cpu"),
        fixed_bytes=1000,
        input_bytes_per_transition=32,
    )
    assert profile.saved_per_transition == 96
    assert profile.saved_per_call == 0
    assert profile.transient_per_transition == 2 * 64 + 32
    factor, reserve = probe.ALLOCATOR_FACTOR["cpu"], probe.RESERVE_BYTES["cpu"]
    assert profile.chunk_bytes(100, 10) == 1000 + reserve + factor * (
        100 * 96 + 10 * 160
    )
    budget = int(profile.chunk_bytes(50, 50))
    assert profile.max_chunk_transitions(budget, limit=10**6) == 50
    assert profile.max_chunk_transitions(budget - 1, limit=10**6) == 49
    assert profile.max_chunk_transitions(budget, limit=20) == 20
    assert profile.max_chunk_transitions(int(profile.chunk_bytes(1, 1)) - 1, 99) == 0


# Chunks sized from the budget ------------------------------------------------------


def budget_for(net, dataset, n_transitions, **kwargs):
    """The budget in which chunks of exactly ``n_transitions`` fit."""
    probe_trainer = make_trainer(copy.deepcopy(net), batch_size=len(dataset), **kwargs)
    probe_trainer._task.refresh_device()
    table = pair_table.read_preferences(dataset)
    profile = probe_trainer._profile(table)
    return int(profile.chunk_bytes(n_transitions, n_transitions))


@pytest.mark.parametrize(
    "cap, two_pass, n_chunks",
    # pairs of 5 + 3 transitions; calls of 4; two passes cut each side on its
    # own: 25 first-fragment transitions in 7 calls, 15 second-fragment in 4
    [(12, 0.0, 5), (16, 0.0, 3), (5, 1.0, 11)],
)
def test_budget_sizes_chunks_in_transitions_and_stays_exact(
    rng, cap, two_pass, n_chunks
):
    dataset = ref.make_dataset(rng, 5, (5, 3), binary=True)
    net = make_net()
    initial = copy.deepcopy(net)
    budget = budget_for(net, dataset, cap, optimizer_cls=th.optim.SGD)
    trainer = make_trainer(
        net,
        batch_size=5,
        memory_budget=budget,
        forward_size=4,
        optimizer_cls=th.optim.SGD,
    )
    trainer.train(dataset)
    assert trainer.step_policy.chunk_cap == cap
    logged = trainer.logger.name_to_value
    assert logged["reward/final/train/two_pass"] == two_pass
    assert logged["reward/final/train/chunk_transitions"] <= cap
    assert logged["reward/final/train/chunks_per_step"] == n_chunks
    pairs, prefs = ref.batch_of(dataset, range(5))
    expected = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    assert ref.relative_error(ref.param_grads(net), expected) < TOL


def test_chosen_chunk_and_estimate_are_logged(rng, capsys):
    dataset = ref.make_dataset(rng, 4, (5,))
    net = make_net()
    trainer = make_trainer(net, batch_size=4, memory_budget=budget_for(net, dataset, 7))
    trainer.train(dataset)
    out = capsys.readouterr().out
    assert "memory_budget:" in out and "chunks of at most 7 transitions" in out
    assert "two passes" in out  # a pair holds 10 transitions
    assert "a whole batch in one chunk would need" in out


# The planner ---------------------------------------------------------------------


@pytest.mark.parametrize("max_items", [None, 1, 2, 3])
@pytest.mark.parametrize("max_transitions", [None, 6, 9, 30])
def test_pair_chunks_respect_both_limits_and_cover_in_order(max_items, max_transitions):
    lengths = np.array([4, 5, 2, 6, 3, 3, 1])
    chunks = planning.pair_chunks(
        lengths, max_items=max_items, max_transitions=max_transitions
    )
    assert [i for s in chunks for i in range(7)[s]] == list(range(7))
    for s in chunks:
        assert max_items is None or s.stop - s.start <= max_items
        over = max_transitions is not None and lengths[s].sum() > max_transitions
        assert not over or s.stop - s.start == 1  # only a lone, too-large item


def test_planner_goes_two_pass_when_a_pair_exceeds_the_cap():
    policy = planning.StepPolicy(chunk_cap=7, forward_size=16)
    result = planning.plan_step(np.array([10, 10]), policy)
    assert result.two_pass and result.forward_size == 7
    assert "memory" in result.reason
    pinned = planning.StepPolicy(chunk_cap=7, forward_size=16, two_pass=False)
    with pytest.raises(ValueError, match="two_pass=False"):
        planning.plan_step(np.array([10, 10]), pinned)


def test_plans_are_one_pass_unless_asked_or_too_large():
    result = planning.plan_step(
        np.array([10, 10, 10]), planning.StepPolicy(minibatch_size=2, forward_size=4)
    )
    assert not result.two_pass and result.forward_size == 4
    assert [(s.start, s.stop) for s in result.item_chunks] == [(0, 2), (2, 3)]
    pinned = planning.StepPolicy(minibatch_size=2, forward_size=4, two_pass=True)
    result = planning.plan_step(np.array([10, 10]), pinned)
    assert result.two_pass and result.forward_size == 4
    whole = planning.plan_step(np.array([10, 10]), planning.StepPolicy())
    assert not whole.two_pass and whole.forward_size == 20


def test_back_off_halves_the_largest_chunk_and_stops_at_one_transition():
    policy = planning.StepPolicy(forward_size=8)
    lengths = np.array([5, 6, 7])
    error = th.OutOfMemoryError("simulated")
    policy = policy.backed_off(planning.plan_step(lengths, policy), error)
    assert policy.chunk_cap == 9
    result = planning.plan_step(lengths, policy)
    assert [s.stop - s.start for s in result.item_chunks] == [1, 1, 1]
    policy = policy.backed_off(result, error)
    assert policy.chunk_cap == 3
    result = planning.plan_step(lengths, policy)
    assert result.two_pass and result.forward_size == 3
    policy = policy.backed_off(result, error)
    assert policy.chunk_cap == 1
    with pytest.raises(th.OutOfMemoryError, match="one transition"):
        policy.backed_off(planning.plan_step(lengths, policy), error)
