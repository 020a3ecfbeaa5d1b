"""AIRL/GAIL: every demo_minibatch_size gives the full-batch discriminator update.

The reference is imitation 1.0.1's own ``train_disc`` with ``demo_minibatch_size=None``:
one training-mode forward of the discriminator over the whole batch, expert and
generator together (imitation's code, independent of this package). Parameters are
compared under SGD, relative to the size of the reference's update; gradients under
Adam relative to the gradient norm. The naive variants fail the same comparisons.
"""

import copy
import logging

import numpy as np
import pytest
import torch as th
from imitation.algorithms.adversarial import airl as imitation_airl
from imitation.algorithms.adversarial import common
from imitation.algorithms.adversarial import gail as imitation_gail
from imitation.rewards.reward_nets import (
    BasicRewardNet,
    BasicShapedRewardNet,
    NormalizedRewardNet,
)
from imitation.util import networks
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn
from torch.nn import functional as F  # noqa: N812

import imitation_accum
from imitation_accum.nets import input_preparation
from imitation_accum.scripts import train_adversarial
from tests import adversarial_setup as setup

TOL = 1e-4  # relative; float32 round-off gives ~1e-6
BATCH = 10
MINIBATCHES = (1, 4, BATCH)  # 4 gives uneven minibatches of 4, 4 and 2
N_STEPS = 3

ALGOS = {
    "AIRL": (imitation_accum.AIRL, imitation_airl.AIRL),
    "GAIL": (imitation_accum.GAIL, imitation_gail.GAIL),
}


@pytest.fixture(scope="module")
def venv():
    return setup.make_venv("CartPole-v1")


@pytest.fixture(scope="module")
def ppo(venv):
    return setup.small_ppo(venv)


def make_net(algo: str, venv, *, normalize: bool = True) -> nn.Module:
    norm = {"normalize_input_layer": networks.RunningNorm} if normalize else {}
    th.manual_seed(0)
    if algo == "AIRL":
        # The potential calls its RunningNorm twice per forward (next_state, state).
        return BasicShapedRewardNet(
            venv.observation_space,
            venv.action_space,
            reward_hid_sizes=(16,),
            potential_hid_sizes=(16, 16),
            **norm,
        )
    return BasicRewardNet(
        venv.observation_space,
        venv.action_space,
        hid_sizes=(16, 16),
        **norm,
    )


def run_steps(trainer, samples):
    return [
        trainer.train_disc(expert_samples=expert, gen_samples=gen)
        for expert, gen in samples
    ]


@pytest.mark.parametrize("normalize", [True, False], ids=["running_norm", "no_norm"])
@pytest.mark.parametrize("minibatch_size", MINIBATCHES)
@pytest.mark.parametrize("algo", ALGOS)
def test_parameters_equal_full_batch_training(
    algo, minibatch_size, normalize, venv, ppo, rng
):
    ours_cls, imitation_cls = ALGOS[algo]
    net = make_net(algo, venv, normalize=normalize)
    samples = setup.sample_sequence(rng, N_STEPS, BATCH, venv)
    reference = setup.make_trainer(
        imitation_cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    ours = setup.make_trainer(
        ours_cls,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=minibatch_size,
    )
    run_steps(reference, samples)
    run_steps(ours, samples)
    assert setup.update_error(net, ours._reward_net, reference._reward_net) < TOL
    assert setup.norm_buffers_close(ours._reward_net, reference._reward_net)
    if normalize:
        assert setup.buffers(ours._reward_net), "the net should hold RunningNorm"


@pytest.mark.parametrize("algo", ALGOS)
def test_gradients_equal_full_batch_under_adam(algo, venv, ppo, rng):
    ours_cls, imitation_cls = ALGOS[algo]
    net = make_net(algo, venv)
    samples = setup.sample_sequence(rng, 2, BATCH, venv)
    kwargs = {"disc_opt_cls": th.optim.Adam, "disc_opt_kwargs": {"lr": 1e-2}}
    reference = setup.make_trainer(
        imitation_cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH, **kwargs
    )
    ours = setup.make_trainer(
        ours_cls,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        minibatch_size=3,
        **kwargs,
    )
    for expert, gen in samples:
        reference.train_disc(expert_samples=expert, gen_samples=gen)
        ours.train_disc(expert_samples=expert, gen_samples=gen)
        # Each step leaves its gradient in .grad; the second step starts from
        # parameters moved by Adam.
        expected = setup.flat_grads(reference._reward_net)
        got = setup.flat_grads(ours._reward_net)
        assert float((got - expected).norm() / expected.norm()) < TOL


@pytest.mark.parametrize("algo", ALGOS)
def test_naive_divisible_minibatches_with_running_norm_fail(algo, venv, ppo, rng):
    """Imitation's own minibatches (divisible sizes) update RunningNorm one by one."""
    _, imitation_cls = ALGOS[algo]
    net = make_net(algo, venv)
    samples = setup.sample_sequence(rng, N_STEPS, BATCH, venv)
    reference = setup.make_trainer(
        imitation_cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    naive = setup.make_trainer(
        imitation_cls,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=5,
    )
    run_steps(reference, samples)
    run_steps(naive, samples)
    # The final RunningNorm buffers agree (a running mean is order-free), but each
    # minibatch was normalized with statistics of the minibatches seen so far.
    assert setup.update_error(net, naive._reward_net, reference._reward_net) > 100 * TOL


def test_naive_mean_of_minibatch_means_fails(venv, ppo, rng):
    """The mean of uneven minibatch means is not the batch mean; ours is the latter."""
    net = make_net("GAIL", venv, normalize=False)
    ((expert, gen),) = setup.sample_sequence(rng, 1, BATCH, venv)
    ours = setup.make_trainer(
        imitation_accum.GAIL,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=4,
    )
    ours.train_disc(expert_samples=expert, gen_samples=gen)

    def bce(rows: slice) -> th.Tensor:
        both = {
            k: np.concatenate([expert[k][rows], gen[k][rows]])
            for k in ("obs", "acts", "next_obs", "dones")
        }
        inputs = net.preprocess(
            both["obs"], both["acts"], both["next_obs"], both["dones"]
        )
        n = len(expert["obs"][rows])
        labels = th.cat([th.ones(n), th.zeros(n)])
        return F.binary_cross_entropy_with_logits(net(*inputs), labels)

    def grads(loss: th.Tensor) -> th.Tensor:
        net.zero_grad()
        loss.backward()
        return setup.flat_grads(net)

    full = grads(bce(slice(0, BATCH)))
    chunks = [slice(0, 4), slice(4, 8), slice(8, 10)]
    naive = grads(sum(bce(rows) for rows in chunks) / len(chunks))
    got = setup.flat_grads(ours._reward_net)
    assert float((got - full).norm() / full.norm()) < TOL
    assert float((naive - full).norm() / full.norm()) > 100 * TOL


@pytest.mark.parametrize("algo", ALGOS)
def test_statistics_are_full_batch_and_do_not_depend_on_minibatch_size(
    algo, venv, ppo, rng
):
    ours_cls, imitation_cls = ALGOS[algo]
    net = make_net(algo, venv)
    ((expert, gen),) = setup.sample_sequence(rng, 1, BATCH, venv)

    def stats_of(cls, **kwargs):
        trainer = setup.make_trainer(
            cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH, **kwargs
        )
        return trainer.train_disc(expert_samples=expert, gen_samples=gen)

    # imitation with one minibatch computes its statistics over the whole batch.
    expected = stats_of(imitation_cls)
    assert expected["n_expert"] == BATCH
    for minibatch_size in (*MINIBATCHES, 3, 7):
        got = stats_of(ours_cls, demo_minibatch_size=minibatch_size)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # imitation's minibatches report the last minibatch, with a scaled-down loss.
    naive = stats_of(imitation_cls, demo_minibatch_size=5)
    assert naive["n_expert"] == 5
    assert naive["disc_loss"] != pytest.approx(expected["disc_loss"], rel=1e-3)


def test_logged_records_match_imitation(venv, ppo, rng, tmp_path):
    net = make_net("AIRL", venv)
    samples = setup.sample_sequence(rng, 2, BATCH, venv)
    tables = {}
    for name, cls, kwargs in [
        ("imitation", imitation_airl.AIRL, {}),
        ("ours", imitation_accum.AIRL, {"demo_minibatch_size": 3}),
    ]:
        folder = tmp_path / name
        trainer = setup.make_trainer(
            cls,
            net,
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=BATCH,
            custom_logger=setup.quiet_logger(str(folder)),
            **kwargs,
        )
        run_steps(trainer, samples)
        rows = (folder / "raw" / "disc" / "progress.csv").read_text().splitlines()
        tables[name] = [line.split(",") for line in rows]
    ours, theirs = tables["ours"], tables["imitation"]
    assert ours[0] == theirs[0]  # the same keys, in the same order
    assert len(ours) == len(theirs) == 3  # one dump per discriminator step
    for row_ours, row_theirs in zip(ours[1:], theirs[1:]):
        assert [float(x) for x in row_ours] == pytest.approx(
            [float(x) for x in row_theirs], rel=1e-5, abs=1e-7
        )


class DropoutExtractor(BaseFeaturesExtractor):
    """A policy feature extractor with dropout: training mode makes it random."""

    def __init__(self, observation_space, features_dim: int = 16) -> None:
        super().__init__(observation_space, features_dim)
        self.net = nn.Sequential(
            nn.Linear(observation_space.shape[0], features_dim),
            nn.Dropout(0.5),
            nn.Tanh(),
        )

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.net(observations)


def test_airl_log_probabilities_use_evaluation_mode_and_no_global_rng(venv, rng):
    policy_kwargs = {"features_extractor_class": DropoutExtractor, "net_arch": []}
    ppo = setup.small_ppo(venv, policy_kwargs=policy_kwargs)
    with th.no_grad():  # confident action logits, so that dropout shows
        ppo.policy.action_net.weight.mul_(30.0)
    net = make_net("AIRL", venv, normalize=False)
    samples = setup.sample_sequence(rng, 2, BATCH, venv)

    # The reference evaluates the policy in evaluation mode, on the whole batch.
    ppo.policy.set_training_mode(False)
    reference = setup.make_trainer(
        imitation_airl.AIRL, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    run_steps(reference, samples)

    # SB3 leaves the policy in training mode after learn().
    ppo.policy.set_training_mode(True)
    for minibatch_size in (1, 4):
        ours = setup.make_trainer(
            imitation_accum.AIRL,
            net,
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=BATCH,
            demo_minibatch_size=minibatch_size,
        )
        torch_rng, numpy_rng = th.get_rng_state(), np.random.get_state()
        run_steps(ours, samples)
        assert th.equal(th.get_rng_state(), torch_rng)
        assert np.random.get_state()[1].tolist() == numpy_rng[1].tolist()
        assert ppo.policy.training, "the policy's mode must be restored"
        assert setup.update_error(net, ours._reward_net, reference._reward_net) < TOL

    # imitation evaluates the policy as it finds it: with dropout on.
    naive = setup.make_trainer(
        imitation_airl.AIRL, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    run_steps(naive, samples)
    assert setup.update_error(net, naive._reward_net, reference._reward_net) > 100 * TOL


def test_gail_does_not_evaluate_the_policy(venv, ppo, rng, monkeypatch):
    net = make_net("GAIL", venv)
    trainer = setup.make_trainer(
        imitation_accum.GAIL,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=3,
    )

    def fail(*args, **kwargs):
        raise AssertionError("GAIL's discriminator does not read the policy")

    monkeypatch.setattr(ppo.policy, "evaluate_actions", fail)
    run_steps(trainer, setup.sample_sequence(rng, 1, BATCH, venv))


@pytest.mark.parametrize("minibatch_size", [1, 3])
def test_max_grad_norm_clips_the_batch_gradient_once(minibatch_size, venv, ppo, rng):
    net = make_net("GAIL", venv)
    ((expert, gen),) = setup.sample_sequence(rng, 1, BATCH, venv)
    lr, max_norm = 0.1, 1e-3
    reference = setup.make_trainer(
        imitation_gail.GAIL, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH, lr=lr
    )
    reference.train_disc(expert_samples=expert, gen_samples=gen)
    grad = setup.flat_grads(reference._reward_net)
    assert grad.norm() > 10 * max_norm  # so that clipping matters
    ours = setup.make_trainer(
        imitation_accum.GAIL,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        lr=lr,
        demo_minibatch_size=minibatch_size,
        max_grad_norm=max_norm,
    )
    ours.train_disc(expert_samples=expert, gen_samples=gen)
    clipped = grad * (max_norm / grad.norm())
    got = setup.flat_grads(ours._reward_net)  # the gradient the step used
    assert float((got - clipped).norm() / max_norm) < TOL
    step = setup.flat_params(net) - setup.flat_params(ours._reward_net)
    # float32 parameters of size ~0.3 round a step of lr * max_norm to ~1e-3.
    assert float((step - lr * clipped).norm() / (lr * max_norm)) < 1e-2
    assert ours.last_disc_result.grad_norm == pytest.approx(float(grad.norm()), 1e-5)


@pytest.mark.parametrize("algo", ALGOS)
def test_non_finite_loss_raises_and_leaves_no_trace(algo, venv, ppo, rng):
    ours_cls, _ = ALGOS[algo]
    net = make_net(algo, venv)
    trainer = setup.make_trainer(
        ours_cls,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=3,
        disc_opt_cls=th.optim.Adam,
        disc_opt_kwargs={"lr": 1e-2},
    )
    (expert, gen), (expert2, gen2) = setup.sample_sequence(rng, 2, BATCH, venv)
    trainer.train_disc(expert_samples=expert, gen_samples=gen)
    before = {
        "params": setup.flat_params(trainer._reward_net),
        "buffers": setup.buffers(trainer._reward_net),
        "optimizer": copy.deepcopy(trainer._disc_opt.state_dict()),
        "disc_step": trainer._disc_step,
    }
    # AIRL's policy reads obs (and rejects NaN itself); its potential reads next_obs.
    field = "next_obs" if algo == "AIRL" else "obs"
    bad = dict(expert2)
    bad[field] = expert2[field].copy()
    bad[field][BATCH - 1, 0] = np.nan  # in the last minibatch
    with pytest.raises(FloatingPointError, match="non-finite"):
        trainer.train_disc(expert_samples=bad, gen_samples=gen2)
    assert th.equal(setup.flat_params(trainer._reward_net), before["params"])
    after = setup.buffers(trainer._reward_net)
    assert all(th.equal(after[k], v) for k, v in before["buffers"].items())
    state = trainer._disc_opt.state_dict()["state"]
    for index, saved in before["optimizer"]["state"].items():
        assert all(th.equal(state[index][k], v) for k, v in saved.items())
    assert trainer._disc_step == before["disc_step"]
    # The trainer goes on as if the failed step had not happened.
    trainer.train_disc(expert_samples=expert2, gen_samples=gen2)
    assert trainer._disc_step == before["disc_step"] + 1


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"demo_minibatch_size": 0}, "demo_minibatch_size"),
        ({"demo_minibatch_size": -2}, "demo_minibatch_size"),
        ({"demo_minibatch_size": 2.5}, "demo_minibatch_size"),
        ({"demo_minibatch_size": "4"}, "demo_minibatch_size"),
        ({"demo_minibatch_size": True}, "demo_minibatch_size"),
        ({"demo_minibatch_size": BATCH + 1}, "demo_minibatch_size"),
        ({"minibatch_size": 0}, "minibatch_size"),
        ({"minibatch_size": BATCH + 1}, "minibatch_size"),
        ({"demo_minibatch_size": 2, "minibatch_size": 3}, "minibatch_size=3"),
        ({"demo_batch_size": 0}, "demo_batch_size"),
        ({"demo_batch_size": 4.0}, "demo_batch_size"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"max_grad_norm": float("nan")}, "max_grad_norm"),
        ({"memory_budget": "lots"}, "memory_budget"),
    ],
)
@pytest.mark.parametrize("algo", ALGOS)
def test_bad_arguments_are_named(algo, kwargs, named, venv, ppo):
    ours_cls, _ = ALGOS[algo]
    wrong_type = {"demo_minibatch_size": (2.5, "4", True), "demo_batch_size": (4.0,)}
    error = ValueError
    if any(kwargs.get(key, None) in values for key, values in wrong_type.items()):
        error = TypeError
    kwargs = {"demo_batch_size": BATCH, **kwargs}
    with pytest.raises(error, match=named):
        setup.make_trainer(
            ours_cls, make_net(algo, venv), venv=venv, gen_algo=ppo, **kwargs
        )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"demo_batch_size": 0},
        {"demo_minibatch_size": BATCH + 1},
        {"demo_minibatch_size": 2, "minibatch_size": 3},
        {"max_grad_norm": float("nan")},
        {"memory_budget": "lots"},
        {"demo_minibatch_size": 3, "memory_budget": "1GiB"},
        {"acceleration": {"compile": "yes"}},
        {"n_disc_updates_per_round": 0},
        {"gen_train_timesteps": -5},
        {"disc_opt_kwargs": "lr=0.1"},
    ],
)
@pytest.mark.parametrize("algo", ALGOS)
def test_constructor_and_config_hook_give_the_same_message(algo, kwargs, venv, ppo):
    ours_cls, _ = ALGOS[algo]
    kwargs = {"demo_batch_size": BATCH, **kwargs}
    with pytest.raises((TypeError, ValueError)) as constructed:
        setup.make_trainer(
            ours_cls, make_net(algo, venv), venv=venv, gen_algo=ppo, **kwargs
        )
    config = {"algorithm_kwargs": kwargs, "algorithm_specific": {}}
    with pytest.raises(constructed.type) as configured:
        train_adversarial.check_algorithm_kwargs(
            config, algo.lower(), logging.getLogger(__name__)
        )
    key = list(kwargs)[-1]  # the bad one
    assert f"algorithm_kwargs.{key}" in str(configured.value)
    assert str(configured.value).replace("algorithm_kwargs.", "") == str(
        constructed.value
    )


@pytest.mark.parametrize("algo", ALGOS)
def test_any_minibatch_size_is_accepted_and_the_alias_agrees(
    algo, venv, ppo, monkeypatch
):
    # The threads chosen: no probe for them, whose forwards would be recorded.
    monkeypatch.setenv("OMP_NUM_THREADS", str(th.get_num_threads()))
    ours_cls, imitation_cls = ALGOS[algo]
    net = make_net(algo, venv)
    with pytest.raises(ValueError, match="multiple"):  # imitation's own check
        setup.make_trainer(
            imitation_cls,
            net,
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=BATCH,
            demo_minibatch_size=3,
        )
    for kwargs in (
        {"demo_minibatch_size": 3},
        {"minibatch_size": 3},
        {"demo_minibatch_size": 3, "minibatch_size": 3},
    ):
        trainer = setup.make_trainer(
            ours_cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH, **kwargs
        )
        assert trainer.demo_minibatch_size == 3
        sizes = []  # transitions of each forward that back-propagates
        logits_fn = trainer.logits_expert_is_high

        def recording(state, *args, logits_fn=logits_fn, sizes=sizes):
            if th.is_grad_enabled():
                sizes.append(len(state))
            return logits_fn(state, *args)

        trainer.logits_expert_is_high = recording
        trainer.train_disc(
            expert_samples=setup.random_samples(np.random.default_rng(0), BATCH, venv),
            gen_samples=setup.random_samples(np.random.default_rng(1), BATCH, venv),
        )
        assert sizes == [6, 6, 6, 2]


@pytest.mark.parametrize("algo", ALGOS)
def test_imitation_defaults_are_kept(algo, venv, ppo):
    ours_cls, imitation_cls = ALGOS[algo]
    net = make_net(algo, venv)
    plain = {"custom_logger": setup.quiet_logger()}
    ours = setup.make_trainer(
        ours_cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH, **plain
    )
    theirs = setup.make_trainer(
        imitation_cls, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH, **plain
    )
    for attribute in (
        "demo_batch_size",
        "demo_minibatch_size",
        "n_disc_updates_per_round",
        "gen_train_timesteps",
        "debug_use_ground_truth",
        "allow_variable_horizon",
        "_disc_opt_cls",
        "_disc_opt_kwargs",
        "_init_tensorboard",
    ):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert isinstance(ours, imitation_cls)
    assert isinstance(ours, common.AdversarialTrainer)


@pytest.mark.parametrize("algo", ALGOS)
def test_bad_samples_are_named_before_any_update(algo, venv, ppo, rng):
    ours_cls, _ = ALGOS[algo]
    net = make_net(algo, venv)
    trainer = setup.make_trainer(
        ours_cls,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=3,
    )
    params, norms = setup.flat_params(trainer._reward_net), setup.buffers(net)
    good = setup.random_samples(rng, BATCH, venv)
    short = setup.random_samples(rng, BATCH - 1, venv)
    wide = setup.random_samples(rng, BATCH, setup.make_venv("Pendulum-v1"))
    cases = [
        ({"expert_samples": short, "gen_samples": good}, "expert_samples"),
        ({"expert_samples": good, "gen_samples": short}, "gen_samples"),
        ({"expert_samples": wide, "gen_samples": good}, "expert_samples"),
        ({"expert_samples": {"obs": good["obs"]}, "gen_samples": good}, "lacks"),
    ]
    for kwargs, named in cases:
        with pytest.raises(ValueError, match=named):
            trainer.train_disc(**kwargs)
    assert th.equal(setup.flat_params(trainer._reward_net), params)
    assert setup.norm_buffers_close(trainer._reward_net, net)
    assert all(
        th.equal(v, setup.buffers(trainer._reward_net)[k]) for k, v in norms.items()
    )
    assert trainer._disc_step == 0


def test_gail_reading_next_state_equals_full_batch(venv, ppo, rng):
    """A discriminator that reads next_state gets it (and its norm statistics)."""
    th.manual_seed(0)
    net = BasicRewardNet(
        venv.observation_space,
        venv.action_space,
        use_next_state=True,
        hid_sizes=(16,),
        normalize_input_layer=networks.RunningNorm,
    )
    samples = setup.sample_sequence(rng, N_STEPS, BATCH, venv)
    reference = setup.make_trainer(
        imitation_gail.GAIL, net, venv=venv, gen_algo=ppo, demo_batch_size=BATCH
    )
    ours = setup.make_trainer(
        imitation_accum.GAIL,
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=3,
    )
    run_steps(reference, samples)
    run_steps(ours, samples)
    assert setup.update_error(net, ours._reward_net, reference._reward_net) < TOL
    assert setup.norm_buffers_close(ours._reward_net, reference._reward_net)


class ReadsEverything(BasicRewardNet):
    def forward(self, state, action, next_state, done):
        return super().forward(state, action, next_state, done) + next_state.sum(1)


def test_next_state_is_skipped_only_where_imitation_ignores_it(venv):
    space, acts = venv.observation_space, venv.action_space
    reads = input_preparation.reads_next_state
    assert not reads(BasicRewardNet(space, acts))
    assert not reads(
        NormalizedRewardNet(BasicRewardNet(space, acts), networks.RunningNorm)
    )
    assert reads(BasicRewardNet(space, acts, use_next_state=True))
    assert reads(ReadsEverything(space, acts))
    assert reads(BasicShapedRewardNet(space, acts))


def test_tensorboard_histogram_holds_the_whole_batch(
    venv, ppo, rng, tmp_path, monkeypatch
):
    trainer = setup.make_trainer(
        imitation_accum.GAIL,
        make_net("GAIL", venv),
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=BATCH,
        demo_minibatch_size=4,
        init_tensorboard=True,
        log_dir=tmp_path,
    )
    histograms = []
    monkeypatch.setattr(
        trainer._summary_writer,
        "add_histogram",
        lambda name, values: histograms.append((name, values)),
    )
    run_steps(trainer, setup.sample_sequence(rng, 1, BATCH, venv))
    ((name, values),) = histograms
    assert name == "disc_logits" and values.shape == (2 * BATCH,)
