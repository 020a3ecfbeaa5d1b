"""AIRL/GAIL end to end: train() with accumulation on, determinism, image frames.

The generator and its PPO are imitation's and SB3's, unchanged; demonstrations are
rollouts of an untrained PPO policy (exactness does not need a good expert).
"""

import re
from typing import Optional

import numpy as np
import pytest
import torch as th
from imitation.algorithms.adversarial import airl as imitation_airl
from imitation.algorithms.adversarial import gail as imitation_gail
from imitation.data import types
from imitation.rewards.reward_nets import (
    BasicRewardNet,
    BasicShapedRewardNet,
    CnnRewardNet,
)
from imitation.util import networks
from torch.nn import functional as F  # noqa: N812

import imitation_accum
from imitation_accum.engine import acceleration, accumulator
from imitation_accum.nets.shaped import CnnShapedRewardNet
from tests import adversarial_setup as setup

N_STEPS = 32  # PPO steps per round (= gen_train_timesteps with one env)


def classic_control_run(
    algo: str,
    *,
    seed: int,
    rounds: int = 3,
    demo_minibatch_size: Optional[int] = 5,  # uneven: 5, 5, ..., 2
    **trainer_kwargs,
):
    """A short train() on Pendulum (AIRL) or CartPole (GAIL); returns the trainer."""
    th.manual_seed(seed)
    np.random.seed(seed)  # imitation's replay buffer samples from numpy's global RNG
    env_id = "Pendulum-v1" if algo == "AIRL" else "CartPole-v1"
    venv = setup.make_venv(env_id, seed=seed)
    ppo = setup.small_ppo(venv, seed=seed, n_steps=N_STEPS)
    demos = setup.rollout_demonstrations(venv, ppo, min_timesteps=200, seed=seed)
    norm = {"normalize_input_layer": networks.RunningNorm}
    if algo == "AIRL":
        net = BasicShapedRewardNet(
            venv.observation_space,
            venv.action_space,
            reward_hid_sizes=(16,),
            potential_hid_sizes=(16,),
            **norm,
        )
        cls = imitation_accum.AIRL
    else:
        net = BasicRewardNet(
            venv.observation_space, venv.action_space, hid_sizes=(16,), **norm
        )
        cls = imitation_accum.GAIL
    trainer = cls(
        demonstrations=demos,
        demo_batch_size=32,
        demo_minibatch_size=demo_minibatch_size,
        venv=venv,
        gen_algo=ppo,
        reward_net=net,
        custom_logger=setup.quiet_logger(),
        allow_variable_horizon=algo == "GAIL",  # CartPole ends early
        **trainer_kwargs,
    )
    trainer.initial_params = setup.flat_params(net)
    trainer.train(rounds * N_STEPS)
    return trainer


@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_train_runs_with_accumulation(algo):
    trainer = classic_control_run(algo, seed=0)
    assert trainer._disc_step == 3 * trainer.n_disc_updates_per_round
    result = trainer.last_disc_result
    assert result is not None and result.n_chunks == 7
    assert np.isfinite(result.loss)
    norm_counts = [
        float(m.count)
        for m in trainer._reward_net.modules()
        if isinstance(m, networks.RunningNorm)
    ]
    # Each step normalizes its expert and generator rows once, as one full batch
    # would; AIRL's potential sees both the observation and the next one.
    rows = 2 * trainer.demo_batch_size * trainer._disc_step
    assert norm_counts == ([rows] if algo == "GAIL" else [rows, 2 * rows])


def test_acceleration_is_applied_once_per_round_of_discriminator_steps(monkeypatch):
    entered = []
    original = acceleration.Acceleration.applied

    def counting(self, net):
        entered.append(th.backends.cudnn.benchmark)
        return original(self, net)

    monkeypatch.setattr(acceleration.Acceleration, "applied", counting)
    before = th.backends.cudnn.benchmark
    trainer = classic_control_run(
        "GAIL",
        seed=0,
        rounds=2,
        n_disc_updates_per_round=3,
        acceleration={"cudnn_benchmark": True},
    )
    assert trainer._disc_step == 6
    # Entered at each round's first step, released before the next round's
    # generator training: the option was off again each time.
    assert entered == [before, before]
    assert th.backends.cudnn.benchmark == before
    assert "forward" not in vars(trainer._reward_net)


def sgd_run(algo: str, minibatch: Optional[int]):
    """Two rounds under SGD (AdamW would turn round-off into full steps)."""
    return classic_control_run(
        algo,
        seed=2,
        rounds=2,
        demo_minibatch_size=minibatch,
        disc_opt_cls=th.optim.SGD,
        disc_opt_kwargs={"lr": 0.05},
    )


@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_train_does_not_depend_on_the_minibatch_size(algo):
    """Whole train() runs: the same samples, draws and updates for every split."""
    runs = {}
    for minibatch in (None, 5, 1):
        trainer = sgd_run(algo, minibatch)
        initial = trainer.initial_params
        runs[minibatch] = (
            setup.flat_params(trainer._reward_net),
            setup.buffers(trainer._reward_net),
            np.random.get_state()[1].copy(),  # numpy's global RNG: the buffer
            th.get_rng_state(),
        )
    params, buffers, numpy_state, torch_state = runs[None]
    for minibatch in (5, 1):
        other_params, other_buffers, other_numpy, other_torch = runs[minibatch]
        # Round-off of the discriminator reaches PPO through the reward, so the
        # runs agree closely rather than bit for bit.
        distance = th.linalg.vector_norm(other_params - params)
        assert distance <= 1e-4 * th.linalg.vector_norm(params - initial)
        for name, value in buffers.items():
            assert th.allclose(other_buffers[name], value, rtol=1e-4, atol=1e-6), name
        # No global RNG is drawn per minibatch: both generators end where the
        # whole-batch run leaves them.
        assert np.array_equal(other_numpy, numpy_state)
        assert th.equal(other_torch, torch_state)


@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_per_minibatch_norm_updates_fail_the_same_comparison(algo, monkeypatch):
    # Naive: no statistics pre-pass, so each minibatch updates RunningNorm itself.
    monkeypatch.setattr(
        accumulator.GradientAccumulator,
        "_gather_norm_statistics",
        lambda self, task, chunks: None,
    )
    finals = {}
    for minibatch in (None, 5):
        trainer = sgd_run(algo, minibatch)
        finals[minibatch] = setup.flat_params(trainer._reward_net)
    update = th.linalg.vector_norm(finals[None] - trainer.initial_params)
    assert th.linalg.vector_norm(finals[5] - finals[None]) > 1e-3 * update


@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_same_seed_gives_bit_identical_discriminators(algo):
    first = classic_control_run(algo, seed=3, rounds=2)._reward_net.state_dict()
    second = classic_control_run(algo, seed=3, rounds=2)._reward_net.state_dict()
    assert first.keys() == second.keys()
    assert all(th.equal(first[k], second[k]) for k in first)
    other = classic_control_run(algo, seed=4, rounds=2)._reward_net.state_dict()
    assert not all(th.equal(first[k], other[k]) for k in first)


def frames_setup(seed: int = 0):
    th.manual_seed(seed)
    np.random.seed(seed)
    venv = setup.make_venv("frames", seed=seed)
    ppo = setup.small_ppo(
        venv,
        seed=seed,
        policy="CnnPolicy",
        n_steps=16,
        batch_size=16,
        policy_kwargs={"features_extractor_kwargs": {"features_dim": 32}},
    )
    return venv, ppo


def frames_net(algo: str, venv) -> th.nn.Module:
    th.manual_seed(1)
    if algo == "AIRL":
        return CnnShapedRewardNet(
            venv.observation_space,
            venv.action_space,
            reward_hid_channels=(8,),
            potential_hid_channels=(8,),
        )
    return CnnRewardNet(venv.observation_space, venv.action_space, hid_channels=(8,))


ACCUM = {"AIRL": imitation_accum.AIRL, "GAIL": imitation_accum.GAIL}
IMITATION = {"AIRL": imitation_airl.AIRL, "GAIL": imitation_gail.GAIL}


@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_train_on_frames_with_a_cnn_policy(algo):
    venv, ppo = frames_setup()
    # As imitation advises for CNN experts: roll out on the expert's own
    # (VecTransposeImage) env; RolloutInfoWrapper records the env's own frames.
    demos = setup.rollout_demonstrations(ppo.get_env(), ppo, min_timesteps=32)
    assert demos.obs.shape[1:] == setup.FRAME_SHAPE
    trainer = ACCUM[algo](
        demonstrations=demos,
        demo_batch_size=8,
        demo_minibatch_size=3,
        venv=venv,
        gen_algo=ppo,
        reward_net=frames_net(algo, venv),
        custom_logger=setup.quiet_logger(),
    )
    assert ppo.policy.observation_space.shape == (4, 36, 36)  # SB3 transposed
    before = setup.flat_params(trainer._reward_net)
    trainer.train(2 * 16)
    assert trainer._disc_step == 2 * trainer.n_disc_updates_per_round
    assert not th.equal(setup.flat_params(trainer._reward_net), before)
    assert np.isfinite(trainer.last_disc_result.loss)


@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_imitation_crashes_on_frames_with_a_cnn_policy(algo, rng):
    """In imitation 1.0.1 the CNN policy's log-probabilities get HWC frames."""
    venv, ppo = frames_setup()
    trainer = setup.make_trainer(
        IMITATION[algo],
        frames_net(algo, venv),
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=4,
    )
    expert, gen = setup.sample_sequence(rng, 1, 4, venv)[0]
    with pytest.raises(RuntimeError, match="channels"):
        trainer.train_disc(expert_samples=expert, gen_samples=gen)


def plain_full_batch_update(algo, net, policy, expert, gen, lr):
    """One SGD step on the whole batch, written out (the reference)."""
    both = {
        k: np.concatenate([expert[k], gen[k]])
        for k in ("obs", "acts", "next_obs", "dones")
    }
    state, action, next_state, done = net.preprocess(
        both["obs"], both["acts"], both["next_obs"], both["dones"]
    )
    logits = net(state, action, next_state, done)
    device = logits.device
    if algo == "AIRL":
        frames_chw = th.as_tensor(both["obs"], device=device).permute(0, 3, 1, 2)
        policy.set_training_mode(False)
        with th.no_grad():
            _, log_probs, _ = policy.evaluate_actions(
                frames_chw, th.as_tensor(both["acts"], device=device)
            )
        logits = logits - log_probs
    n = len(expert["obs"])
    labels = th.cat([th.ones(n), th.zeros(n)]).to(device)
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    net.zero_grad()
    loss.backward()
    with th.no_grad():
        for p in net.parameters():
            p -= lr * p.grad


@pytest.mark.parametrize("minibatch_size", [1, 3, 6])
@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_frames_update_equals_full_batch(algo, minibatch_size, rng):
    venv, ppo = frames_setup()
    net = frames_net(algo, venv)
    expert, gen = setup.sample_sequence(rng, 1, 6, venv)[0]
    trainer = setup.make_trainer(
        ACCUM[algo],
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=6,
        demo_minibatch_size=minibatch_size,
        lr=1.0,
    )
    trainer.train_disc(expert_samples=expert, gen_samples=gen)
    reference = setup.copy.deepcopy(net).to(setup.DEVICE)
    plain_full_batch_update(algo, reference, ppo.policy, expert, gen, lr=1.0)
    assert setup.update_error(net, trainer._reward_net, reference) < 1e-4


def test_channels_first_demonstrations_give_the_same_update(rng):
    venv, ppo = frames_setup()
    net = frames_net("AIRL", venv)
    expert, gen = setup.sample_sequence(rng, 1, 4, venv)[0]
    chw = {
        **expert,
        "obs": np.transpose(expert["obs"], (0, 3, 1, 2)),
        "next_obs": np.transpose(expert["next_obs"], (0, 3, 1, 2)),
    }
    nets = []
    for samples in (expert, chw):
        trainer = setup.make_trainer(
            imitation_accum.AIRL,
            net,
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=4,
            demo_minibatch_size=3,
        )
        trainer.train_disc(expert_samples=samples, gen_samples=gen)
        nets.append(setup.flat_params(trainer._reward_net))
    assert th.equal(nets[0], nets[1])
    wrong = {**expert, "obs": expert["obs"][:, :, :30]}
    with pytest.raises(ValueError, match=r"expert_samples\['obs'\]"):
        trainer.train_disc(expert_samples=wrong, gen_samples=gen)


def test_a_wrong_sample_count_keeps_imitations_message(rng):
    venv = setup.make_venv("CartPole-v1")
    ppo = setup.small_ppo(venv)
    net = BasicRewardNet(venv.observation_space, venv.action_space)
    trainer = setup.make_trainer(
        imitation_accum.GAIL, net, venv=venv, gen_algo=ppo, demo_batch_size=4
    )
    samples = setup.random_samples(rng, 4, venv)
    short = setup.random_samples(rng, 3, venv)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Need to have exactly `demo_batch_size` number of expert and "
            "generator samples, each."
        ),
    ):
        trainer.train_disc(expert_samples=samples, gen_samples=short)


def imitation_test_trainer(cls, algo: str, venv, ppo, demos):
    """The trainer of imitation 1.0.1's ``tests/algorithms/test_adversarial.py``.

    One demonstration per batch (its default ``demo_batch_size``), on CartPole.
    """
    if algo == "AIRL":
        net = BasicShapedRewardNet(venv.observation_space, venv.action_space)
    else:
        net = BasicRewardNet(venv.observation_space, venv.action_space)
    return cls(
        demonstrations=demos,
        demo_batch_size=1,
        venv=venv,
        gen_algo=ppo,
        reward_net=net,
        custom_logger=setup.quiet_logger(),
    )


@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_imitations_sample_errors_are_raised_in_its_order(algo):
    """As imitation 1.0.1's tests of train_disc without or with unequal samples."""
    venv = setup.make_venv("CartPole-v1")
    ppo = setup.small_ppo(venv)
    demos = setup.rollout_demonstrations(venv, ppo, min_timesteps=20)
    assert len(demos) >= 2
    expert_samples = types.dataclass_quick_asdict(demos)
    gen_samples = types.dataclass_quick_asdict(demos[:-1])
    messages = []
    for cls in (IMITATION[algo], ACCUM[algo]):
        trainer = imitation_test_trainer(cls, algo, venv, ppo, demos)
        with pytest.raises(RuntimeError, match="No generator samples"):
            trainer.train_disc()
        # imitation checks for an empty replay buffer before it counts samples.
        with pytest.raises(RuntimeError, match="No generator samples"):
            trainer.train_disc(expert_samples=expert_samples)
        with pytest.raises(ValueError, match="n_expert") as error:
            trainer.train_disc(expert_samples=expert_samples, gen_samples=gen_samples)
        messages.append(str(error.value))
    imitations, ours = messages
    assert "(n_gen=" in imitations
    assert ours.startswith(imitations)
