"""Directions whose gradient is zero in exact arithmetic come out exactly zero.

With equal-length fragments a constant shift of the reward changes no return
difference, so the output bias (and the bias of a hidden unit active on every
transition) has an exact gradient of zero. AdamW divides by the gradient's own
magnitude and turns round-off there into a full learning-rate step, so these
directions must come out 0.0, not 1e-9: the two sides of the pairs are laid out
as mirrored calls whose contributions cancel bit for bit.
"""

import copy

import numpy as np
import pytest
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet

from tests import reference as ref
from tests.test_preference_exactness import TOL, make_trainer

N_PAIRS = 12
LENGTH = 7


def make_net() -> BasicRewardNet:
    # Biases start positive so that every hidden unit is active on every input.
    th.manual_seed(0)
    net = BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=(16, 16))
    return net


def output_bias(net: BasicRewardNet) -> th.Tensor:
    return list(net.mlp.parameters())[-1]


def dataset(seed: int = 5):
    return ref.make_dataset(np.random.default_rng(seed), N_PAIRS, (LENGTH,))


def step_grads(net, data, **kwargs):
    trainer = make_trainer(net, batch_size=len(data), **kwargs)
    trainer.train(data)
    return ref.param_grads(net)


SETTINGS = [
    dict(minibatch_size=None, forward_size=2 * N_PAIRS * LENGTH),  # whole
    dict(minibatch_size=None, forward_size=3),  # odd calls
    dict(minibatch_size=5, forward_size=4),  # uneven chunks 5 + 5 + 2
    dict(minibatch_size=1, forward_size=1),
    dict(minibatch_size=7, forward_size=LENGTH),
    dict(minibatch_size=None, forward_size=3, two_pass=True),
    dict(minibatch_size=None, forward_size=1, two_pass=True),
]


@pytest.mark.parametrize("discount", [1.0, 0.9])
@pytest.mark.parametrize("kwargs", SETTINGS)
def test_output_bias_gradient_is_exactly_zero(kwargs, discount):
    data = dataset()
    net = make_net()
    initial = copy.deepcopy(net)
    grads = step_grads(net, data, discount=discount, **kwargs)
    pairs, prefs = ref.batch_of(data, np.arange(N_PAIRS))
    expected = ref.grads_of(
        initial,
        lambda: ref.full_batch_loss(initial, pairs, prefs, discount=discount),
    )
    assert ref.relative_error(grads, expected) < TOL
    assert float(grads[-1].abs().max()) == 0.0  # the output bias
    assert float(expected[-1].abs().max()) < 1e-6  # zero, up to round-off


def side_after_side_grads(net, data, *, minibatch_size, forward_size):
    """Naive, written plainly: the sides' calls one after the other.

    Per minibatch, every call over its first fragments, then every call over its
    second fragments (not mirrored call by call); the sum of per-pair losses over
    the batch's pairs, one backward per minibatch.
    """
    pairs, prefs = ref.batch_of(data, np.arange(len(data)))
    size = minibatch_size or len(pairs)
    for begin in range(0, len(pairs), size):
        part, part_prefs = pairs[begin : begin + size], prefs[begin : begin + size]
        returns = []
        for side in (0, 1):
            frags = [pair[side] for pair in part]
            obs = np.concatenate([f.obs[:-1] for f in frags])
            acts = np.concatenate([f.acts for f in frags])
            next_obs = np.concatenate([f.obs[1:] for f in frags])
            calls = []
            for s in range(0, len(acts), forward_size):
                e = min(s + forward_size, len(acts))
                dones = np.zeros(e - s, dtype=bool)
                calls.append(
                    net(*net.preprocess(obs[s:e], acts[s:e], next_obs[s:e], dones))
                )
            rewards = th.cat(calls)
            returns.append(rewards.reshape(len(part), LENGTH).sum(dim=1))
        p = 1 / (1 + th.exp(returns[1] - returns[0]))
        y = th.as_tensor(part_prefs)
        losses = -(y * th.log(p) + (1 - y) * th.log(1 - p))
        (losses.sum() / len(pairs)).backward()
    return ref.param_grads(net)


def test_sides_called_one_after_the_other_leave_round_off():
    data = dataset()
    pairs, prefs = ref.batch_of(data, np.arange(N_PAIRS))
    net = make_net()
    expected = ref.grads_of(net, lambda: ref.full_batch_loss(net, pairs, prefs))
    nonzero = 0
    for kwargs in SETTINGS[:5]:
        naive = side_after_side_grads(make_net(), data, **kwargs)
        assert ref.relative_error(naive, expected) < TOL, kwargs  # right, but...
        nonzero += float(naive[-1].abs().max()) > 0  # ...not exactly zero
    assert nonzero >= 3


def adamw_params(data, steps, **kwargs):
    net = make_net()
    trainer = make_trainer(
        net, batch_size=len(data), optimizer_cls=th.optim.AdamW, **kwargs
    )
    for _ in range(steps):
        trainer.train(data)
    return ref.flat(list(net.parameters()))


def test_adamw_parameters_agree_across_minibatch_and_call_sizes():
    data = dataset()
    reference = adamw_params(data, 10, minibatch_size=None, forward_size=1000)
    for kwargs in SETTINGS[1:]:
        params = adamw_params(data, 10, **kwargs)
        error = float(th.linalg.vector_norm(params - reference))
        assert error / float(th.linalg.vector_norm(reference)) < 1e-6, kwargs
