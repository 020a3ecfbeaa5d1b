"""Regularizers act once per optimizer step.

The lambda updater sees item-weighted losses that do not depend on
``minibatch_size``.
"""

import copy

import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers, updaters
from imitation.util import logger as imit_logger
from imitation.util import networks

from tests import reference as ref
from tests.test_preference_exactness import make_net, make_trainer, sgd_trainer

LR = 0.05
LAMBDA = 0.02


def lp_factory(**kwargs):
    kwargs.setdefault("val_split", None)
    return regularizers.LpRegularizer.create(initial_lambda=LAMBDA, p=2, **kwargs)


def weight_decay_factory(**kwargs):
    kwargs.setdefault("val_split", None)
    return regularizers.WeightDecayRegularizer.create(initial_lambda=LAMBDA, **kwargs)


def sgd_reference(net, dataset, *, seed, batch_size, epochs, kind, per_minibatch=None):
    """Plain SGD with the regularizer once per step (or per minibatch: naive)."""
    for perm in ref.epoch_permutations(seed, len(dataset), epochs):
        for start in range(0, len(perm), batch_size):
            idx = perm[start : start + batch_size]
            parts = (
                [idx]
                if per_minibatch is None
                else [
                    idx[s : s + per_minibatch]
                    for s in range(0, len(idx), per_minibatch)
                ]
            )
            grads = [th.zeros_like(p) for p in net.parameters()]
            for part in parts:
                pairs, prefs = ref.batch_of(dataset, part)
                share = len(part) / len(idx)

                def loss(pairs=pairs, prefs=prefs, share=share):
                    value = ref.full_batch_loss(net, pairs, prefs) * share
                    if kind == "lp":
                        value = value + LAMBDA * sum(
                            p.pow(2).sum() for p in net.parameters()
                        )
                    return value

                for g, new in zip(grads, ref.grads_of(net, loss)):
                    g += new
                if kind == "weight_decay":
                    with th.no_grad():
                        for p in net.parameters():
                            p -= LAMBDA * LR * p
            with th.no_grad():
                for p, g in zip(net.parameters(), grads):
                    p -= LR * g
    return net


@pytest.mark.parametrize("kind", ["lp", "weight_decay"])
@pytest.mark.parametrize("minibatch_size", [None, 1, 3])
def test_regularizer_once_per_step(rng, kind, minibatch_size):
    dataset = ref.make_dataset(rng, 9, (3, 5))
    net = make_net()
    initial = copy.deepcopy(net)
    factory = lp_factory() if kind == "lp" else weight_decay_factory()
    trainer = sgd_trainer(
        net,
        seed=3,
        batch_size=4,
        minibatch_size=minibatch_size,
        epochs=2,
        lr=LR,
        forward_size=6,
        regularizer_factory=factory,
    )
    trainer.train(dataset)
    expected = sgd_reference(
        copy.deepcopy(initial), dataset, seed=3, batch_size=4, epochs=2, kind=kind
    )
    naive = sgd_reference(
        copy.deepcopy(initial),
        dataset,
        seed=3,
        batch_size=4,
        epochs=2,
        kind=kind,
        per_minibatch=2,
    )
    actual = list(net.parameters())
    assert ref.relative_error(actual, list(expected.parameters())) < 1e-6
    assert (
        ref.relative_error(list(naive.parameters()), list(expected.parameters())) > 1e-4
    )


class RecordingUpdater(updaters.LambdaUpdater):
    """Keeps lambda fixed and records what it is given."""

    def __init__(self):
        self.calls = []

    def __call__(self, lambda_, train_loss, val_loss):
        self.calls.append((float(train_loss), float(val_loss)))
        return lambda_


def run_with_updater(trainer_cls, dataset, minibatch_size, **kwargs):
    th.manual_seed(0)
    net = make_net()
    recorder = RecordingUpdater()
    trainer = trainer_cls(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(5),
        batch_size=8,
        minibatch_size=minibatch_size,
        epochs=2,
        custom_logger=imit_logger.configure(format_strs=[]),
        regularizer_factory=lp_factory(lambda_updater=recorder, val_split=0.25),
        **kwargs,
    )
    trainer.train(dataset)
    return recorder.calls, net, trainer


def test_lambda_updater_losses_do_not_depend_on_minibatch_size(rng):
    from imitation_accum import CrossEntropyRewardTrainer

    dataset = ref.make_dataset(rng, 20, (4,), binary=True)
    kwargs = {"progress_bar": False, "forward_size": 7}
    calls = {
        mb: run_with_updater(CrossEntropyRewardTrainer, dataset, mb, **kwargs)[0]
        for mb in (None, 8, 3, 1)
    }
    for mb in (8, 3, 1):
        np.testing.assert_allclose(calls[mb], calls[None], rtol=1e-5)
    # imitation 1.0.1 feeds sums over minibatches: the validation loss changes
    # with the minibatch size.
    imitation_calls = {
        mb: run_with_updater(pc.BasicRewardTrainer, dataset, mb)[0] for mb in (8, 2)
    }
    assert abs(imitation_calls[8][0][1] - imitation_calls[2][0][1]) > 0.1


def test_lambda_updater_gets_item_weighted_means(rng):
    from imitation_accum import CrossEntropyRewardTrainer

    dataset = ref.make_dataset(rng, 20, (4, 3), binary=True)
    calls, _, _ = run_with_updater(
        CrossEntropyRewardTrainer,
        dataset,
        3,
        progress_bar=False,
        forward_size=5,
        optimizer_cls=th.optim.SGD,
    )
    # Replay: the same split and batch order, plain SGD, record the losses.
    th.manual_seed(0)
    replay = make_net()
    split_rng = np.random.default_rng(5)
    order = split_rng.permutation(20)
    val_idx, train_idx = np.sort(order[:5]), np.sort(order[5:])
    for epoch in range(2):
        perm = split_rng.permutation(train_idx)
        losses = []
        for s in range(0, len(perm), 8):
            pairs, prefs = ref.batch_of(dataset, perm[s : s + 8])

            def loss(pairs=pairs, prefs=prefs):
                return ref.full_batch_loss(replay, pairs, prefs) + LAMBDA * sum(
                    p.pow(2).sum() for p in replay.parameters()
                )

            with th.no_grad():
                losses.append(ref.full_batch_loss(replay, pairs, prefs) * len(pairs))
            grads = ref.grads_of(replay, loss)
            with th.no_grad():
                for p, g in zip(replay.parameters(), grads):
                    p -= 1e-3 * g
        pairs, prefs = ref.batch_of(dataset, val_idx)
        with th.no_grad():
            replay.eval()
            val_loss = ref.full_batch_loss(replay, pairs, prefs)
            replay.train()
        expected = (float(sum(losses)) / len(train_idx), float(val_loss))
        np.testing.assert_allclose(calls[epoch], expected, rtol=1e-5)


def eval_sensitive_net():
    """Dropout and a RunningNorm: training mode gives other figures than eval."""
    return make_net(dropout_prob=0.5, normalize_input_layer=networks.RunningNorm)


def eval_mode_loss(net, pairs, prefs):
    """The reference evaluation: a copy of ``net`` in eval mode, no grad."""
    copied = copy.deepcopy(net).eval()
    with th.no_grad():
        return float(ref.full_batch_loss(copied, pairs, prefs))


def train_mode_loss(net, pairs, prefs):
    """What an evaluation left in training mode would see (for the contrast)."""
    copied = copy.deepcopy(net).train()
    with th.no_grad():
        return float(ref.full_batch_loss(copied, pairs, prefs))


@pytest.mark.parametrize("minibatch_size", [None, 2])
def test_evaluate_runs_in_evaluation_mode(rng, minibatch_size):
    dataset = ref.make_dataset(rng, 6, (4, 3), binary=True)
    net = eval_sensitive_net()
    trainer = make_trainer(
        net,
        batch_size=6,
        minibatch_size=minibatch_size,
        forward_size=5,
        custom_logger=imit_logger.configure(format_strs=[]),
    )
    trainer.train(dataset)  # the norm's statistics away from their start
    pairs, prefs = ref.batch_of(dataset, np.arange(6))
    expected = eval_mode_loss(net, pairs, prefs)
    before = ref.buffers(net)
    th.manual_seed(1)
    result = trainer.evaluate(dataset)
    assert result.loss == pytest.approx(expected, rel=1e-5)
    assert net.training  # the mode is restored
    for name, value in ref.buffers(net).items():  # statistics frozen
        assert th.equal(value, before[name]), name
    # The mode matters here: training mode (dropout, norm updates) differs.
    th.manual_seed(1)
    assert abs(train_mode_loss(net, pairs, prefs) - expected) > 1e-3 * expected


class SnapshotUpdater(updaters.LambdaUpdater):
    """Keeps lambda fixed; records the validation loss and the net it scored."""

    def __init__(self, net):
        self.net = net
        self.calls = []

    def __call__(self, lambda_, train_loss, val_loss):
        self.calls.append((float(val_loss), copy.deepcopy(self.net)))
        return lambda_


def test_lambda_updater_validation_loss_in_evaluation_mode(rng):
    from imitation_accum import CrossEntropyRewardTrainer

    dataset = ref.make_dataset(rng, 20, (4, 3), binary=True)
    net = eval_sensitive_net()
    recorder = SnapshotUpdater(net)
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(5),
        batch_size=8,
        minibatch_size=3,
        epochs=2,
        forward_size=5,
        progress_bar=False,
        custom_logger=imit_logger.configure(format_strs=[]),
        regularizer_factory=lp_factory(lambda_updater=recorder, val_split=0.25),
    )
    trainer.train(dataset)
    # The validation split of imitation's trainer: the first quarter of a
    # permutation drawn from the trainer's rng.
    val_idx = np.sort(np.random.default_rng(5).permutation(20)[:5])
    pairs, prefs = ref.batch_of(dataset, val_idx)
    assert len(recorder.calls) == 2
    for val_loss, scored in recorder.calls:
        expected = eval_mode_loss(scored, pairs, prefs)
        assert val_loss == pytest.approx(expected, rel=1e-5)
        assert abs(train_mode_loss(scored, pairs, prefs) - expected) > 1e-3 * expected


def sgd_clipped_reference(net, dataset, *, seed, batch_size, epochs, clip, naive):
    """Plain SGD on loss + Lp penalty, its gradient clipped once per step.

    The package's order: the penalty's gradient is added, then the total is
    clipped. ``naive`` clips the loss gradient first and adds the penalty after.
    """
    for perm in ref.epoch_permutations(seed, len(dataset), epochs):
        for start in range(0, len(perm), batch_size):
            pairs, prefs = ref.batch_of(dataset, perm[start : start + batch_size])
            loss_grads = ref.grads_of(
                net,
                lambda pairs=pairs, prefs=prefs: ref.full_batch_loss(net, pairs, prefs),
            )
            penalty_grads = [2 * LAMBDA * p.detach() for p in net.parameters()]

            def clipped(grads):
                norm = th.sqrt(sum(g.pow(2).sum() for g in grads))
                scale = min(1.0, clip / (float(norm) + 1e-6))
                return [g * scale for g in grads]

            if naive:
                grads = [a + b for a, b in zip(clipped(loss_grads), penalty_grads)]
            else:
                grads = clipped([a + b for a, b in zip(loss_grads, penalty_grads)])
            with th.no_grad():
                for p, g in zip(net.parameters(), grads):
                    p -= LR * g
    return net


@pytest.mark.parametrize("minibatch_size", [None, 3])
def test_regularizer_then_clipping_against_a_plain_reference(rng, minibatch_size):
    dataset = ref.make_dataset(rng, 9, (3, 5))
    net = make_net()
    initial = copy.deepcopy(net)
    clip = 0.05  # well below the gradient norms here: every step is clipped
    trainer = sgd_trainer(
        net,
        seed=3,
        batch_size=4,
        minibatch_size=minibatch_size,
        epochs=2,
        lr=LR,
        forward_size=6,
        max_grad_norm=clip,
        regularizer_factory=lp_factory(),
    )
    trainer.train(dataset)
    common = dict(seed=3, batch_size=4, epochs=2, clip=clip)
    expected = sgd_clipped_reference(
        copy.deepcopy(initial), dataset, naive=False, **common
    )
    naive = sgd_clipped_reference(copy.deepcopy(initial), dataset, naive=True, **common)
    actual = list(net.parameters())
    assert ref.relative_error(actual, list(expected.parameters())) < 1e-6
    assert ref.relative_error(actual, list(naive.parameters())) > 1e-4
