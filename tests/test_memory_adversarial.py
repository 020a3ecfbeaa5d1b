"""memory_budget for AIRL and GAIL: minibatches sized to fit, exact, OOM back-off.

The reference is imitation 1.0.1's own ``train_disc`` on the whole batch.
"""

import numpy as np
import pytest
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet
from imitation.util import networks

from imitation_accum.planning import budget, probe
from imitation_accum.planning.plan import plan_step
from tests import adversarial_setup as setup
from tests.test_adversarial_exactness import (
    ALGOS,
    BATCH,
    N_STEPS,
    TOL,
    make_net,
    run_steps,
)


@pytest.fixture(scope="module")
def venv():
    return setup.make_venv("CartPole-v1")


@pytest.fixture(scope="module")
def ppo(venv):
    return setup.small_ppo(venv)


@pytest.fixture
def budget_of_rows(monkeypatch):
    """Makes ``memory_budget="auto"`` hold exactly the given number of rows."""
    captured = {}
    original = probe.profile_activations

    def capturing(*args, **kwargs):
        captured["profile"] = original(*args, **kwargs)
        return captured["profile"]

    def set_rows(rows):
        monkeypatch.setattr(probe, "profile_activations", capturing)
        monkeypatch.setattr(
            budget,
            "resolve_budget",
            lambda budget, device, resident: int(
                captured["profile"].chunk_bytes(rows, rows)
            ),
        )

    return set_rows


@pytest.mark.parametrize("algo", ALGOS)
def test_budget_sizes_minibatches_and_stays_exact(algo, venv, ppo, rng, budget_of_rows):
    ours_cls, imitation_cls = ALGOS[algo]
    net = make_net(algo, venv)
    samples = setup.sample_sequence(rng, N_STEPS, BATCH, venv)
    reference = setup.make_trainer(
        imitation_cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    budget_of_rows(4)
    ours = setup.make_trainer(
        ours_cls,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        memory_budget="auto",
    )
    run_steps(reference, samples)
    run_steps(ours, samples)
    rows = plan_step(np.ones(BATCH, dtype=np.int64), ours.step_policy).item_chunks
    assert [s.stop - s.start for s in rows] == [4, 4, 2]
    assert setup.update_error(net, ours._reward_net, reference._reward_net) < TOL
    assert setup.norm_buffers_close(ours._reward_net, reference._reward_net)


def test_an_assigned_budget_takes_effect_at_the_next_step(
    venv, ppo, rng, budget_of_rows
):
    net = make_net("GAIL", venv)
    samples = setup.sample_sequence(rng, N_STEPS, BATCH, venv)
    reference = setup.make_trainer(
        ALGOS["GAIL"][1], net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    ours = setup.make_trainer(
        ALGOS["GAIL"][0], net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    ours.memory_budget = "6GiB"
    run_steps(reference, samples[:1])
    run_steps(ours, samples[:1])
    assert ours.memory_budget == 6 * 2**30
    budget_of_rows(4)
    ours.memory_budget = "auto"  # a new budget is fitted afresh
    run_steps(reference, samples[1:])
    run_steps(ours, samples[1:])
    rows = plan_step(np.ones(BATCH, dtype=np.int64), ours.step_policy).item_chunks
    assert [s.stop - s.start for s in rows] == [4, 4, 2]
    assert setup.update_error(net, ours._reward_net, reference._reward_net) < TOL


class OutOfMemoryAbove(BasicRewardNet):
    """Raises CUDA's out-of-memory error on calls with gradient above ``limit``."""

    limit = 10**9

    def forward(self, state, action, next_state, done):
        rewards = super().forward(state, action, next_state, done)
        if th.is_grad_enabled() and len(state) > self.limit:
            raise th.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return rewards


def test_out_of_memory_halves_minibatches_and_redoes_the_step(venv, ppo, rng):
    th.manual_seed(0)
    net = OutOfMemoryAbove(venv.observation_space, venv.action_space, hid_sizes=(16,))
    samples = setup.sample_sequence(rng, N_STEPS, BATCH, venv)
    uninterrupted = setup.make_trainer(
        ALGOS["GAIL"][0], net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    net.limit = 6  # 3 rows of an expert and a generator transition
    ours = setup.make_trainer(
        ALGOS["GAIL"][0], net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    run_steps(uninterrupted, samples)
    run_steps(ours, samples)
    assert ours.step_policy.chunk_cap == 2  # 10 rows, then 5, then 2
    assert setup.update_error(net, ours._reward_net, uninterrupted._reward_net) < TOL
    net.limit = 0
    stuck = setup.make_trainer(
        ALGOS["GAIL"][0], net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    before = setup.flat_params(stuck._reward_net)
    with pytest.raises(th.OutOfMemoryError, match="one row"):
        run_steps(stuck, samples[:1])
    assert th.equal(setup.flat_params(stuck._reward_net), before)


@pytest.mark.parametrize("algo", ALGOS)
def test_redone_step_with_norms_and_dropout_equals_an_uninterrupted_one(
    algo, venv, ppo, rng
):
    """The failed attempts' norm updates and dropout draws leave no trace."""
    th.manual_seed(0)
    net = OutOfMemoryAbove(
        venv.observation_space,
        venv.action_space,
        hid_sizes=(16,),
        normalize_input_layer=networks.RunningNorm,
        dropout_prob=0.3,
    )
    samples = setup.sample_sequence(rng, N_STEPS, BATCH, venv)
    results = []
    for limit, minibatch in ((10**9, 2), (6, None)):  # the second backs off to 2
        net.limit = limit
        trainer = setup.make_trainer(
            ALGOS[algo][0],
            net,
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=BATCH,
            demo_minibatch_size=minibatch,
        )
        th.manual_seed(1)
        run_steps(trainer, samples)
        results.append(
            (
                setup.flat_params(trainer._reward_net),
                setup.buffers(trainer._reward_net),
                th.get_rng_state(),
            ),
        )
    assert trainer.step_policy.chunk_cap == 2
    (params, buffers, rng_state), (redone_params, redone_buffers, redone_rng) = results
    assert th.equal(redone_params, params)
    assert buffers.keys() == redone_buffers.keys() and buffers
    assert all(th.equal(redone_buffers[k], buffers[k]) for k in buffers)
    assert th.equal(redone_rng, rng_state)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(memory_budget="1GiB", demo_minibatch_size=2), "alternatives"),
        (dict(memory_budget="1GiB", minibatch_size=2), "alternatives"),
        (dict(memory_budget="lots"), "memory_budget"),
        (dict(memory_budget=0), "memory_budget"),
        (dict(memory_budget="1KB"), "memory_budget=.*smaller"),
    ],
)
def test_bad_budgets_are_rejected_at_construction(venv, ppo, kwargs, match):
    with pytest.raises(ValueError, match=match):
        setup.make_trainer(
            ALGOS["GAIL"][0],
            make_net("GAIL", venv),
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=BATCH,
            **kwargs,
        )


def test_budget_below_one_row_fails_before_the_first_update(venv, ppo, rng):
    net = make_net("GAIL", venv)
    needed = budget.training_state_bytes(th.optim.SGD(net.parameters(), lr=0.1))
    trainer = setup.make_trainer(
        ALGOS["GAIL"][0],
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        memory_budget=needed + 1024,
    )
    before = setup.flat_params(trainer._reward_net)
    with pytest.raises(ValueError, match="too small"):
        run_steps(trainer, setup.sample_sequence(rng, 1, BATCH, venv))
    assert np.array_equal(setup.flat_params(trainer._reward_net), before)
