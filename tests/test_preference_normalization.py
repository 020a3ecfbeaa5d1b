"""RunningNorm / EMANorm statistics are those of one forward over the whole batch."""

import copy

import numpy as np
import pytest
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet, BasicShapedRewardNet
from imitation.util import networks
from torch import nn

from tests import reference as ref
from tests.test_preference_exactness import TOL, make_trainer


def shaped_net(norm) -> BasicShapedRewardNet:
    # The base MLP normalizes its input once; the potential normalizes next_state,
    # then state: its norm layer is called twice per forward.
    return BasicShapedRewardNet(
        ref.OBS_SPACE,
        ref.ACT_SPACE,
        reward_hid_sizes=(8,),
        potential_hid_sizes=(8,),
        normalize_input_layer=norm,
        discount_factor=0.9,
    )


def one_step(net, dataset, **kwargs):
    trainer = make_trainer(net, batch_size=len(dataset), **kwargs)
    trainer.train(dataset)
    return ref.param_grads(net), ref.buffers(net)


def reference_step(net, dataset):
    """Gradients and final buffers of one training-mode forward of everything."""
    pairs, prefs = ref.batch_of(dataset, range(len(dataset)))
    grads = ref.grads_of(net, lambda: ref.full_batch_loss(net, pairs, prefs))
    return grads, ref.buffers(net)


def assert_buffers_close(actual, expected):
    assert actual.keys() == expected.keys()
    for key in expected:
        if expected[key].dtype.is_floating_point:
            th.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-6)
        else:
            assert th.equal(actual[key], expected[key]), key


def warm_up(net, rng):
    """Give the norm layers some history, as after earlier steps."""
    net.train()
    with th.no_grad():
        for _ in range(2):
            obs = th.as_tensor(rng.normal(size=(7, 4)) * 3 + 1, dtype=th.float32)
            acts = th.as_tensor(rng.integers(0, 3, size=7))
            net(*net.preprocess(obs.numpy(), acts.numpy(), obs.numpy(), np.zeros(7)))


@pytest.mark.parametrize("norm", [networks.RunningNorm, networks.EMANorm])
@pytest.mark.parametrize(
    ("minibatch_size", "forward_size"),
    [(None, 1000), (None, 4), (2, 5), (1, 3), (3, 1)],
)
def test_norm_statistics_match_one_full_forward(
    rng, norm, minibatch_size, forward_size
):
    dataset = ref.make_dataset(rng, 5, (3, 6, 4))
    net = shaped_net(norm)
    warm_up(net, rng)
    initial = copy.deepcopy(net)
    grads, buffers = one_step(
        net,
        dataset,
        minibatch_size=minibatch_size,
        forward_size=forward_size,
    )
    expected_grads, expected_buffers = reference_step(initial, dataset)
    assert ref.relative_error(grads, expected_grads) < TOL
    assert_buffers_close(buffers, expected_buffers)


def naive_per_chunk_norm_grads(net, dataset, minibatch_size):
    """Each minibatch runs the net in training mode: statistics move per chunk."""
    pairs, prefs = ref.batch_of(dataset, range(len(dataset)))
    total = 0
    for s in range(0, len(pairs), minibatch_size):
        chunk = ref.full_batch_loss(
            net,
            pairs[s : s + minibatch_size],
            prefs[s : s + minibatch_size],
        )
        total = total + chunk * len(pairs[s : s + minibatch_size]) / len(pairs)
    return ref.grads_of(net, lambda: total), ref.buffers(net)


@pytest.mark.parametrize("norm", [networks.RunningNorm, networks.EMANorm])
def test_per_chunk_norm_updates_fail_the_same_test(rng, norm):
    dataset = ref.make_dataset(rng, 6, (4,))
    net = shaped_net(norm)
    warm_up(net, rng)
    expected_grads, expected_buffers = reference_step(copy.deepcopy(net), dataset)
    naive_grads, naive_buffers = naive_per_chunk_norm_grads(
        copy.deepcopy(net), dataset, 2
    )
    # minibatches are normalized with statistics of part of the batch
    assert ref.relative_error(naive_grads, expected_grads) > 100 * TOL
    if norm is networks.EMANorm:
        # and an EMA weighs its updates by how many there were
        key = "potential._potential_net.normalize_input.running_var"
        assert not th.allclose(naive_buffers[key], expected_buffers[key], rtol=1e-4)


class ChainedNorms(BasicRewardNet):
    """A net whose second norm layer normalizes the first one's output."""

    def __init__(self):
        super().__init__(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=(8,))
        self.first = networks.RunningNorm(7)
        self.mix = nn.Linear(7, 7)
        self.second = networks.EMANorm(7)

    def forward(self, state, action, next_state, done):
        x = th.cat([state, action], dim=1)
        x = self.second(th.tanh(self.mix(self.first(x))))
        return self.mlp(x[:, :7])


def test_chained_norm_layers_are_exact(rng):
    dataset = ref.make_dataset(rng, 5, (4, 2))
    net = ChainedNorms()
    net.mlp[0] = nn.Linear(7, 8)  # the MLP now reads the 7 mixed features
    warm_up(net, rng)
    initial = copy.deepcopy(net)
    trainer = make_trainer(
        net, batch_size=5, minibatch_size=2, forward_size=3, epochs=2
    )
    trainer.train(dataset)  # epoch 1 learns that the layers are chained
    assert trainer.engine.norms.chained is True
    net2 = copy.deepcopy(initial)
    grads, buffers = one_step(net2, dataset, minibatch_size=2, forward_size=3)
    expected_grads, expected_buffers = reference_step(copy.deepcopy(initial), dataset)
    assert ref.relative_error(grads, expected_grads) < TOL
    assert_buffers_close(buffers, expected_buffers)


def test_unchained_layers_need_one_pre_pass(rng):
    dataset = ref.make_dataset(rng, 4, (3,))
    net = shaped_net(networks.RunningNorm)
    trainer = make_trainer(
        net, batch_size=4, minibatch_size=1, forward_size=2, epochs=3
    )
    calls = []
    net.register_forward_pre_hook(lambda *_: calls.append(th.is_grad_enabled()))
    trainer.train(dataset)
    no_grad_calls = calls.count(False)
    # 4 one-pair chunks x 2 sides x 2 calls (3 transitions of a side, 2 per call)
    per_pass = 4 * 2 * 2
    # step 1: two pre-passes (the second confirms the layers are not chained)
    assert trainer.engine.norms.chained is False
    assert no_grad_calls == per_pass * (2 + 1 + 1)


@pytest.mark.parametrize(
    "layer",
    [nn.BatchNorm1d(7), nn.SyncBatchNorm(7)],
)
def test_batch_norm_is_rejected_by_name(layer):
    net = BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=(8,))
    net.mlp.add_module("coupling_norm", layer)
    with pytest.raises(ValueError, match=r"mlp\.coupling_norm"):
        make_trainer(net)


def test_unknown_base_norm_is_rejected():
    class OtherNorm(networks.BaseNorm):
        def update_stats(self, batch):
            self.running_mean += batch.mean(0)

    net = BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=(8,))
    net.mlp.add_module("other", OtherNorm(1))
    with pytest.raises(ValueError, match=r"mlp\.other"):
        make_trainer(net)
