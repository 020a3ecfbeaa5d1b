"""What imitation code relies on: its attributes, its accepted values, its errors."""

import copy
import re

import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers, updaters

from imitation_accum import EnsembleTrainer
from tests import reference as ref
from tests.test_preference_exactness import make_net, make_trainer


def test_an_assigned_optimizer_is_the_one_stepped(rng):
    dataset = ref.make_dataset(rng, 4, (3,))
    net = make_net()
    initial = copy.deepcopy(net)
    trainer = make_trainer(net, batch_size=4, forward_size=8)
    trainer.optim = th.optim.SGD(net.parameters(), lr=0.5)
    trainer.train(dataset)
    pairs, prefs = ref.batch_of(dataset, np.arange(4))
    grads = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    expected = [p - 0.5 * g for p, g in zip(initial.parameters(), grads)]
    assert ref.relative_error(list(net.parameters()), expected) < 1e-6


def test_an_assigned_optimizer_reaches_the_regularizer(rng):
    factory = regularizers.WeightDecayRegularizer.create(
        initial_lambda=0.1,
        lambda_updater=updaters.IntervalParamScaler(0.1, (0.9, 1.1)),
        val_split=0.25,
    )
    trainer = make_trainer(make_net(), batch_size=4, regularizer_factory=factory)
    new = th.optim.SGD(trainer._preference_model.parameters(), lr=0.5)
    trainer.optim = new
    assert trainer.regularizer.optimizer is new
    with pytest.raises(
        TypeError, match=re.escape("optim must be a torch.optim.Optimizer")
    ):
        trainer.optim = "sgd"


def test_a_learning_rate_of_zero_trains_without_moving(rng):
    dataset = ref.make_dataset(rng, 4, (3,))
    net = make_net()
    before = ref.flat(list(net.parameters()))
    trainer = make_trainer(net, batch_size=2, lr=0, forward_size=8)
    trainer.train(dataset)
    assert th.equal(ref.flat(list(net.parameters())), before)
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        make_trainer(make_net(), lr=-1e-3)


def test_imitations_messages_are_kept(rng):
    with pytest.raises(
        TypeError,
        match=re.escape(
            "PreferenceModel of a RewardEnsemble expected by EnsembleTrainer."
        ),
    ):
        EnsembleTrainer(
            pc.PreferenceModel(make_net()),
            pc.CrossEntropyRewardLoss(),
            rng=rng,
        )
    factory = regularizers.LpRegularizer.create(
        initial_lambda=0.1,
        lambda_updater=updaters.IntervalParamScaler(0.1, (0.9, 1.1)),
        p=2,
        val_split=0.1,
    )
    trainer = make_trainer(make_net(), batch_size=2, regularizer_factory=factory)
    with pytest.raises(
        ValueError,
        match="Not enough data samples to split into training and validation",
    ):
        trainer.train(ref.make_dataset(rng, 3, (3,)))
    with pytest.raises(
        ValueError, match=re.escape("Must train for at least one epoch.")
    ):
        make_trainer(make_net(), batch_size=2).train(
            ref.make_dataset(rng, 3, (3,)), epoch_multiplier=0.1
        )
