"""activation_checkpointing: CNN activations recomputed in the backward, exactly."""

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from imitation.rewards.reward_nets import CnnRewardNet

from imitation_accum.engine import acceleration
from imitation_accum.planning import probe
from tests import reference as ref
from tests.test_preference_exactness import TOL, make_net, make_trainer

FRAMES = gym.spaces.Box(0, 255, (12, 10, 3), np.uint8)
ACTIONS = gym.spaces.Discrete(3)


def make_cnn(**kwargs):
    th.manual_seed(0)
    return CnnRewardNet(FRAMES, ACTIONS, hid_channels=(4, 4), **kwargs)


def frames_dataset(rng, n_pairs=4, lengths=(5, 3)):
    return ref.make_dataset(rng, n_pairs, lengths, obs_space=FRAMES, n_actions=3)


def one_step(net, dataset, **kwargs):
    trainer = make_trainer(
        net,
        batch_size=len(dataset),
        forward_size=4,
        optimizer_cls=th.optim.SGD,
        lr=1e-9,
        **kwargs,
    )
    trainer.train(dataset)
    return ref.param_grads(net)


@pytest.mark.parametrize("split", [dict(minibatch_size=2), dict(two_pass=True)])
def test_checkpointing_is_exact(rng, split):
    dataset = frames_dataset(rng)
    net = make_cnn()
    initial = copy.deepcopy(net)
    grads = one_step(net, dataset, activation_checkpointing=True, **split)
    pairs, prefs = ref.batch_of(dataset, range(len(dataset)))
    expected = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    assert ref.relative_error(grads, expected) < TOL


class Recomputed:
    """``net`` whose whole forward is recomputed in the backward (torch's own)."""

    def __init__(self, net, *, preserve_rng_state):
        self.net, self.preserve_rng_state = net, preserve_rng_state

    def preprocess(self, *args):
        return self.net.preprocess(*args)

    def __call__(self, *inputs):
        return th.utils.checkpoint.checkpoint(
            self.net,
            *inputs,
            preserve_rng_state=self.preserve_rng_state,
            use_reentrant=False,
        )


def test_recomputation_draws_the_forwards_dropout_masks(rng):
    dataset = frames_dataset(rng)
    net = make_cnn(dropout_prob=0.5)
    th.manual_seed(7)
    plain = one_step(copy.deepcopy(net), dataset, minibatch_size=2)
    th.manual_seed(7)
    checkpointed = one_step(
        copy.deepcopy(net), dataset, minibatch_size=2, activation_checkpointing=True
    )
    assert ref.relative_error(checkpointed, plain) < TOL
    # Written plainly: recomputing without replaying the RNG draws other masks
    # (so the comparison above would see it), replaying it draws the same.
    pairs, prefs = ref.batch_of(dataset, range(len(dataset)))

    def grads(preserve_rng_state=None):
        copied = copy.deepcopy(net)
        model = (
            copied
            if preserve_rng_state is None
            else Recomputed(copied, preserve_rng_state=preserve_rng_state)
        )
        th.manual_seed(7)
        return ref.grads_of(copied, lambda: ref.full_batch_loss(model, pairs, prefs))

    expected = grads()
    assert ref.relative_error(grads(preserve_rng_state=True), expected) < TOL
    assert ref.relative_error(grads(preserve_rng_state=False), expected) > 100 * TOL


def test_checkpointing_keeps_only_the_stack_inputs():
    net = make_cnn()
    frames = th.randint(0, 256, (6, *FRAMES.shape), dtype=th.uint8)
    acts = th.zeros(6, dtype=th.int64)
    dones = th.zeros(6, dtype=th.bool)

    def run(n):
        return net(*net.preprocess(frames[:n], acts[:n], frames[:n], dones[:n]))

    params = list(net.parameters())
    cpu = th.device("cpu")
    plain = probe.measure_saved_bytes(run, 6, params, cpu)
    with acceleration.checkpointing(acceleration.checkpointable_cnns(net)):
        kept = probe.measure_saved_bytes(run, 6, params, cpu)
    # The two ReLU outputs of 4 channels and the pooled features the final layer
    # reads are no longer kept; the stack's input (and what the net saves outside
    # the stack) stays.
    relu_outputs, pooled = 2 * 6 * 12 * 10 * 4 * 4, 6 * 4 * 4
    assert plain.saved - kept.saved == relu_outputs + pooled
    assert kept.saved < 0.3 * plain.saved


def test_checkpointing_leaves_the_net_unchanged(rng):
    dataset = frames_dataset(rng, n_pairs=2)
    net = make_cnn()
    keys = list(net.state_dict())
    one_step(net, dataset, activation_checkpointing=True)
    assert list(net.state_dict()) == keys
    assert "forward" not in vars(net.cnn)
    pickle.dumps(net)  # imitation saves reward nets whole


@pytest.mark.parametrize(("value", "error"), [(True, ValueError), ("yes", TypeError)])
def test_checkpointing_needs_a_cnn_and_a_bool(value, error):
    with pytest.raises(error, match="activation_checkpointing"):
        make_trainer(make_net(), activation_checkpointing=value)
