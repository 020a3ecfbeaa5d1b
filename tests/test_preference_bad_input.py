"""Bad input is refused before training; a failed step leaves no trace."""

import copy

import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers, updaters
from imitation.util import networks

from imitation_accum import CrossEntropyRewardTrainer
from tests import reference as ref
from tests.test_preference_exactness import make_net, make_trainer


@pytest.mark.parametrize(
    ("kwargs", "name", "error"),
    [
        ({"batch_size": 0}, "batch_size", ValueError),
        ({"batch_size": 2.5}, "batch_size", TypeError),
        ({"batch_size": True}, "batch_size", TypeError),
        ({"minibatch_size": 0}, "minibatch_size", ValueError),
        ({"minibatch_size": -3}, "minibatch_size", ValueError),
        ({"minibatch_size": "4"}, "minibatch_size", TypeError),
        ({"batch_size": 4, "minibatch_size": 5}, "minibatch_size", ValueError),
        ({"epochs": 0}, "epochs", ValueError),
        ({"lr": -1.0}, "lr", ValueError),
        ({"forward_size": 0}, "forward_size", ValueError),
        ({"forward_size": "fast"}, "forward_size", ValueError),
        ({"max_grad_norm": 0.0}, "max_grad_norm", ValueError),
        ({"max_grad_norm": float("nan")}, "max_grad_norm", ValueError),
        ({"drop_last": "yes"}, "drop_last", TypeError),
    ],
)
def test_bad_arguments_name_themselves(kwargs, name, error):
    with pytest.raises(error, match=name):
        make_trainer(make_net(), **kwargs)


class NotARegularizer:
    def __init__(self, optimizer, logger):
        self.optimizer = optimizer


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"custom_logger": "x"}, TypeError, r"^custom_logger must be None or an"),
        ({"regularizer_factory": "x"}, TypeError, r"^regularizer_factory must be"),
        (
            {"regularizer_factory": NotARegularizer},
            TypeError,
            r"^regularizer_factory must build an imitation Regularizer",
        ),
        (
            {"optimizer_cls": "AdamW"},
            TypeError,
            r"^optimizer_cls .*torch\.optim\.AdamW",
        ),
        ({"optimizer_cls": 5}, TypeError, r"^optimizer_cls must be a torch\.optim"),
        ({"optimizer_cls": th.nn.Linear}, TypeError, r"^optimizer_cls must be"),
        (
            {"optimizer_kwargs": {"betas": 5}},
            ValueError,
            r"^optimizer_kwargs\.betas=5 refused by AdamW: TypeError",
        ),
        (
            {"optimizer_kwargs": {"eps": 1e-8, "weight_decay": -1}},
            ValueError,
            r"^optimizer_kwargs\.weight_decay=-1 refused by AdamW: .*weight_decay",
        ),
        (
            {"optimizer_cls": th.optim.SGD, "optimizer_kwargs": {"momentum": -0.5}},
            ValueError,
            r"^optimizer_kwargs\.momentum=-0\.5 refused by SGD",
        ),
    ],
)
def test_constructor_names_a_bad_logger_regularizer_or_optimizer(
    kwargs, error, message
):
    with pytest.raises(error, match=message):
        make_trainer(make_net(), **kwargs)


def test_optimizer_is_built_once_with_its_arguments():
    net = make_net()
    trainer = make_trainer(
        net, lr=0.25, optimizer_cls=th.optim.SGD, optimizer_kwargs={"momentum": 0.5}
    )
    assert isinstance(trainer.optim, th.optim.SGD)
    group = trainer.optim.param_groups[0]
    assert (group["lr"], group["momentum"]) == (0.25, 0.5)
    assert {id(p) for p in group["params"]} == {id(p) for p in net.parameters()}


def test_wrong_loss_is_refused():
    class OtherLoss(pc.CrossEntropyRewardLoss):
        def forward(self, fragment_pairs, preferences, preference_model):
            raise NotImplementedError

    with pytest.raises(TypeError, match="loss"):
        CrossEntropyRewardTrainer(
            pc.PreferenceModel(make_net()),
            OtherLoss(),
            np.random.default_rng(0),
        )


def test_empty_dataset(rng):
    trainer = make_trainer(make_net())
    with pytest.raises(ValueError, match=r"^dataset holds no preference pairs$"):
        trainer.train(pc.PreferenceDataset())


def test_zero_epochs(rng):
    trainer = make_trainer(make_net(), epochs=1)
    with pytest.raises(ValueError, match="epoch_multiplier"):
        trainer.train(ref.make_dataset(rng, 3), epoch_multiplier=0.2)


def test_preferences_outside_unit_interval(rng):
    dataset = ref.make_dataset(rng, 4)
    dataset.preferences[2] = 1.5
    net = make_net()
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match=r"\n  pair 2: has preference 1\.5 "):
        make_trainer(net).train(dataset)
    assert all(th.equal(before[k], v) for k, v in net.state_dict().items())


def test_drop_last_with_too_little_data(rng):
    trainer = make_trainer(make_net(), batch_size=8, drop_last=True)
    with pytest.raises(ValueError, match="drop_last"):
        trainer.train(ref.make_dataset(rng, 5))


class ExplodingAfter:
    """Makes the reward net's output non-finite for the given fragments."""

    def __init__(self, net, poisoned_value):
        self.poisoned_value = poisoned_value
        net.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        state = inputs[0]
        bad = (state == self.poisoned_value).all(dim=1)
        return th.where(bad, th.full_like(output, float("nan")), output)


def snapshot(trainer, net):
    return {
        "params": copy.deepcopy(net.state_dict()),
        "optim": copy.deepcopy(trainer.optim.state_dict()),
        "lambda": trainer.regularizer.lambda_ if trainer.regularizer else None,
        "torch_rng": th.get_rng_state(),
    }


def assert_same_state(before, after):
    for key, value in before["params"].items():
        assert th.equal(value, after["params"][key]), key
    assert before["lambda"] == after["lambda"]
    assert th.equal(before["torch_rng"], after["torch_rng"])
    b, a = before["optim"]["state"], after["optim"]["state"]
    assert b.keys() == a.keys()
    for k in b:
        for name in b[k]:
            assert th.equal(th.as_tensor(b[k][name]), th.as_tensor(a[k][name]))


def test_non_finite_loss_names_step_and_minibatch_and_leaves_no_trace(rng):
    dataset = ref.make_dataset(rng, 8, (3,))
    seed = 11
    # The trainer's draws, plainly: 2 of 8 pairs held out for the regularizer's
    # validation, then the first epoch's permutation of the other 6, in batches
    # of 3 (minibatches of 2 and 1 pairs). The second batch's third pair, in
    # its minibatch 1, carries a poisoned frame (steps and minibatches are
    # counted from 0 in the message).
    draws = np.random.default_rng(seed)
    train = np.sort(draws.permutation(8)[2:])
    second_batch = draws.permutation(train)[3:6]
    poisoned = second_batch[2]
    dataset.fragments2[poisoned].obs[1] = 7.25
    net = make_net(normalize_input_layer=networks.RunningNorm, dropout_prob=0.2)
    ExplodingAfter(net, 7.25)
    factory = regularizers.LpRegularizer.create(
        initial_lambda=0.1,
        p=2,
        lambda_updater=updaters.IntervalParamScaler(0.5, (0.1, 0.2)),
        val_split=0.25,
    )
    trainer = make_trainer(
        net,
        seed=seed,
        batch_size=3,
        minibatch_size=2,
        forward_size=4,
        regularizer_factory=factory,
    )
    states = []
    original = trainer.engine.step

    def record_then_step(*args, **kwargs):
        states.append(snapshot(trainer, net))
        return original(*args, **kwargs)

    trainer.engine.step = record_then_step
    # the split takes 2 pairs for validation: find the step that meets the poison
    with pytest.raises(
        FloatingPointError,
        match=r"^non-finite loss at step 1 in minibatch 1 of 2; the step was discarded",
    ):
        trainer.train(dataset)
    assert_same_state(states[-1], snapshot(trainer, net))
    assert all(p.grad is None for p in net.parameters())


def test_non_finite_gradient_is_refused(rng):
    dataset = ref.make_dataset(rng, 4, (3,))
    net = make_net()
    net.mlp.dense0.weight.register_hook(lambda g: g * float("inf"))
    trainer = make_trainer(net, batch_size=4, minibatch_size=2, forward_size=3)
    before = snapshot(trainer, net)
    with pytest.raises(FloatingPointError, match="gradient"):
        trainer.train(dataset)
    assert_same_state(before, snapshot(trainer, net))
