"""Every minibatch size gives the full-batch update.

Each clause of the exactness contract is checked against an independent reference
(tests/reference.py), and the naive variant fails the same test.
"""

import copy

import numpy as np
import pytest
import torch as th
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards.reward_nets import BasicRewardNet

from imitation_accum import CrossEntropyRewardTrainer
from tests import reference as ref

TOL = 2e-5  # relative to the gradient norm; float32 round-off is ~1e-7


def make_net(**kwargs) -> BasicRewardNet:
    return BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=(16, 16), **kwargs)


def make_trainer(net, *, seed=1, discount=1.0, noise=0.0, threshold=50.0, **kwargs):
    model = pc.PreferenceModel(
        net,
        noise_prob=noise,
        discount_factor=discount,
        threshold=threshold,
    )
    kwargs.setdefault("progress_bar", False)
    return CrossEntropyRewardTrainer(
        model,
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(seed),
        **kwargs,
    )


def one_step_grads(net, dataset, *, minibatch_size, forward_size=3, **kwargs):
    """Gradients of a single step over the whole dataset (left in .grad)."""
    trainer = make_trainer(
        net,
        batch_size=len(dataset),
        minibatch_size=minibatch_size,
        forward_size=forward_size,
        **kwargs,
    )
    trainer.train(dataset)
    return ref.param_grads(net), trainer


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    batch_size=st.integers(1, 9),
    data=st.data(),
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    discount=st.sampled_from([1.0, 0.9, 0.5]),
    noise=st.sampled_from([0.0, 0.1, 0.5]),
    forward_size=st.integers(1, 12),
    binary=st.booleans(),
)
def test_step_gradient_equals_full_batch(
    batch_size,
    data,
    lengths,
    discount,
    noise,
    forward_size,
    binary,
):
    minibatch_size = data.draw(st.integers(1, batch_size), label="minibatch_size")
    rng = np.random.default_rng(batch_size * 1000 + sum(lengths))
    dataset = ref.make_dataset(rng, batch_size, lengths, binary=binary)
    th.manual_seed(0)
    net = make_net()
    initial = copy.deepcopy(net)

    grads, _ = one_step_grads(
        net,
        dataset,
        minibatch_size=minibatch_size,
        forward_size=forward_size,
        discount=discount,
        noise=noise,
    )
    pairs, prefs = ref.batch_of(dataset, range(batch_size))
    expected = ref.grads_of(
        initial,
        lambda: ref.full_batch_loss(
            initial, pairs, prefs, discount=discount, noise_prob=noise
        ),
    )
    assert ref.relative_error(grads, expected) < TOL


def naive_mean_of_means_grads(net, pairs, prefs, minibatch_size):
    """What a hand-rolled loop often does: average the minibatch means."""
    chunks = range(0, len(pairs), minibatch_size)
    total = sum(
        ref.full_batch_loss(
            net, pairs[s : s + minibatch_size], prefs[s : s + minibatch_size]
        )
        for s in chunks
    )
    return ref.grads_of(net, lambda: total / len(chunks))


def test_uneven_minibatches_weighted_by_size_and_naive_fails(rng):
    dataset = ref.make_dataset(rng, 7, (4, 6))
    net = make_net()
    initial = copy.deepcopy(net)
    grads, _ = one_step_grads(net, dataset, minibatch_size=3)  # chunks of 3, 3, 1
    pairs, prefs = ref.batch_of(dataset, range(7))
    expected = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    naive = naive_mean_of_means_grads(copy.deepcopy(initial), pairs, prefs, 3)
    assert ref.relative_error(grads, expected) < TOL
    assert ref.relative_error(naive, expected) > 100 * TOL


def sgd_reference_training(
    net,
    dataset,
    *,
    seed,
    batch_size,
    epochs,
    lr,
    regularize=None,
    scale_partial=False,
):
    """Plain SGD over the documented batch order.

    ``scale_partial`` applies imitation 1.0.1's scaling of a partial batch by
    ``len(batch) / batch_size``.
    """
    for perm in ref.epoch_permutations(seed, len(dataset), epochs):
        for start in range(0, len(perm), batch_size):
            idx = perm[start : start + batch_size]
            pairs, prefs = ref.batch_of(dataset, idx)
            loss = ref.full_batch_loss(net, pairs, prefs)
            if scale_partial:
                loss = loss * len(idx) / batch_size
            if regularize is not None:
                loss = loss + regularize(net)
            grads = ref.grads_of(net, lambda loss=loss: loss)
            with th.no_grad():
                for p, g in zip(net.parameters(), grads):
                    p -= lr * g
    return net


def sgd_trainer(net, **kwargs):
    return make_trainer(net, optimizer_cls=th.optim.SGD, **kwargs)


@pytest.mark.parametrize("minibatch_size", [None, 1, 3])
def test_partial_last_batch_is_plain_mean(rng, minibatch_size):
    dataset = ref.make_dataset(rng, 10, (3, 5))
    net = make_net()
    initial = copy.deepcopy(net)
    trainer = sgd_trainer(
        net,
        seed=7,
        batch_size=4,  # batches of 4, 4, 2
        minibatch_size=minibatch_size,
        epochs=2,
        lr=0.1,
        forward_size=4,
    )
    trainer.train(dataset)
    expected = sgd_reference_training(
        copy.deepcopy(initial), dataset, seed=7, batch_size=4, epochs=2, lr=0.1
    )
    scaled = sgd_reference_training(
        copy.deepcopy(initial),
        dataset,
        seed=7,
        batch_size=4,
        epochs=2,
        lr=0.1,
        scale_partial=True,
    )
    actual = list(net.parameters())
    assert ref.relative_error(actual, list(expected.parameters())) < 1e-6
    # imitation 1.0.1 scales the partial batch down; that is a different update.
    assert ref.relative_error(actual, list(scaled.parameters())) > 1e-4


def test_drop_last_skips_partial_batch(rng):
    dataset = ref.make_dataset(rng, 10, (3,))
    net = make_net()
    trainer = make_trainer(net, batch_size=4, drop_last=True, forward_size=8)
    steps = []
    original = trainer.engine.step
    trainer.engine.step = lambda task, chunks, **kw: (
        steps.append(kw["n_items"]) or original(task, chunks, **kw)
    )
    trainer.train(dataset)
    assert steps == [4, 4]


def test_unequal_fragment_lengths_use_own_returns(rng):
    """Imitation 1.0.1 crashes when a pair's fragments differ in length."""
    dataset = ref.make_dataset(rng, 4, (2, 7, 4), binary=True)
    net = make_net()
    with pytest.raises(Exception):  # noqa: B017 - whatever imitation raises
        pc.CrossEntropyRewardLoss()(
            list(zip(dataset.fragments1, dataset.fragments2)),
            dataset.preferences,
            pc.PreferenceModel(net, discount_factor=0.9),
        )
    initial = copy.deepcopy(net)
    grads, _ = one_step_grads(net, dataset, minibatch_size=3, discount=0.9)
    pairs, prefs = ref.batch_of(dataset, range(4))
    expected = ref.grads_of(
        initial,
        lambda: ref.full_batch_loss(initial, pairs, prefs, discount=0.9),
    )
    assert ref.relative_error(grads, expected) < TOL


def test_threshold_clips_return_differences(rng):
    dataset = ref.make_dataset(rng, 6, (5,), binary=True)
    net = make_net()
    with th.no_grad():
        net.mlp.dense_final.bias.fill_(3.0)
        net.mlp.dense_final.weight.mul_(20.0)
    initial = copy.deepcopy(net)
    grads, _ = one_step_grads(net, dataset, minibatch_size=4, threshold=0.2)
    pairs, prefs = ref.batch_of(dataset, range(6))
    expected = ref.grads_of(
        initial,
        lambda: ref.full_batch_loss(initial, pairs, prefs, threshold=0.2),
    )
    unclipped = ref.grads_of(
        initial,
        lambda: ref.full_batch_loss(initial, pairs, prefs, threshold=50.0),
    )
    assert ref.relative_error(grads, expected) < TOL
    assert ref.relative_error(unclipped, expected) > 1e-2


def test_terminal_fragments_mark_done(rng):
    """A terminal fragment's last transition is done; a net using ``done`` sees it."""
    net = make_net(use_done=True)
    dataset = ref.make_dataset(rng, 5, (3, 4), terminal=True)
    initial = copy.deepcopy(net)
    grads, _ = one_step_grads(net, dataset, minibatch_size=2, forward_size=5)
    pairs, prefs = ref.batch_of(dataset, range(5))
    expected = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    assert ref.relative_error(grads, expected) < TOL


def test_max_grad_norm_clips_once_per_step(rng):
    dataset = ref.make_dataset(rng, 6, (4,), binary=True)
    net = make_net()
    initial = copy.deepcopy(net)
    grads, trainer = one_step_grads(net, dataset, minibatch_size=2, max_grad_norm=0.05)
    pairs, prefs = ref.batch_of(dataset, range(6))
    full = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    norm = float(th.linalg.vector_norm(ref.flat(full)))
    assert norm > 0.05
    expected = [g * (0.05 / (norm + 1e-6)) for g in full]
    assert ref.relative_error(grads, expected) < TOL
    logged = trainer.logger.name_to_value["reward/final/train/grad_norm"]
    assert logged == pytest.approx(norm, rel=1e-5)
    # Clipping each minibatch's gradient separately is a different update.
    per_chunk = []
    for s in range(0, 6, 2):
        g = ref.grads_of(
            initial,
            lambda s=s: (
                ref.full_batch_loss(initial, pairs[s : s + 2], prefs[s : s + 2]) / 3
            ),
        )
        n = float(th.linalg.vector_norm(ref.flat(g)))
        per_chunk.append([x * min(1.0, 0.05 / (n + 1e-6)) for x in g])
    naive = [sum(parts) for parts in zip(*per_chunk)]
    assert ref.relative_error(naive, expected) > 100 * TOL
