"""Accelerator options: checked up front, and exact on the CPU.

Each option (and all of them together) gives the full-batch update of an
independent reference (tests/reference.py) within float round-off; the naive
variants of what the options do (padding rows that keep their weight, minibatch
means averaged) fail the same test.
"""

import copy
import io
import itertools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards.reward_nets import BasicRewardNet, CnnRewardNet
from imitation.util import logger as imit_logger
from imitation.util import networks

from imitation_accum import Acceleration, CrossEntropyRewardTrainer
from imitation_accum.engine import acceleration as acceleration_module
from tests import reference as ref

TOL = 2e-5  # relative to the gradient norm
FRAMES = gym.spaces.Box(0, 255, (10, 10, 2), np.uint8)  # height, width, channels
QUICK_COMPILE = dict(compile=True, compile_backend="aot_eager")


def make_cnn() -> CnnRewardNet:
    return CnnRewardNet(FRAMES, ref.ACT_SPACE, hid_channels=(4, 4))


def make_trainer(net, **kwargs) -> CrossEntropyRewardTrainer:
    kwargs.setdefault("progress_bar", False)
    kwargs.setdefault("custom_logger", imit_logger.configure(format_strs=[]))
    return CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(1),
        **kwargs,
    )


def one_step_grads(net, dataset, acceleration, *, minibatch_size=2, forward_size=3):
    trainer = make_trainer(
        net,
        batch_size=len(dataset),
        minibatch_size=minibatch_size,
        forward_size=forward_size,
        acceleration=acceleration,
    )
    trainer.train(dataset)
    return ref.param_grads(net)


@pytest.fixture
def frames_dataset(rng):
    # Unequal lengths and forward_size=3: every side ends in a ragged call.
    return ref.make_dataset(rng, 5, (4, 5), obs_space=FRAMES)


def reference_grads(net, dataset):
    pairs, prefs = ref.batch_of(dataset, range(len(dataset)))
    return ref.grads_of(net, lambda: ref.full_batch_loss(net, pairs, prefs))


@pytest.mark.parametrize(
    "options",
    [
        dict(pinned_staging=True),
        dict(channels_last=True),
        dict(cudnn_benchmark=True),
        QUICK_COMPILE,
        dict(pinned_staging=True, channels_last=True, cudnn_benchmark=True)
        | QUICK_COMPILE,
    ],
    ids=["pinned_staging", "channels_last", "cudnn_benchmark", "compile", "all"],
)
def test_each_option_gives_full_batch_gradient(frames_dataset, options):
    net = make_cnn()
    initial = copy.deepcopy(net)
    grads = one_step_grads(net, frames_dataset, options)
    expected = reference_grads(initial, frames_dataset)
    assert ref.relative_error(grads, expected) < TOL


def test_two_pass_with_all_options_gives_full_batch_gradient(frames_dataset):
    options = dict(pinned_staging=True, channels_last=True) | QUICK_COMPILE
    net = make_cnn()
    initial = copy.deepcopy(net)
    trainer = make_trainer(
        net,
        batch_size=len(frames_dataset),
        two_pass=True,
        forward_size=3,
        acceleration=options,
    )
    trainer.train(frames_dataset)
    assert trainer.last_plan is not None and trainer.last_plan.two_pass
    expected = reference_grads(initial, frames_dataset)
    assert ref.relative_error(ref.param_grads(net), expected) < TOL


@pytest.mark.expensive
def test_inductor_compile_gives_full_batch_gradient(frames_dataset):
    """PyTorch's default backend generates C++ on a CPU: about 20 s."""
    net = make_cnn()
    initial = copy.deepcopy(net)
    grads = one_step_grads(net, frames_dataset, dict(compile=True))
    expected = reference_grads(initial, frames_dataset)
    assert ref.relative_error(grads, expected) < TOL


def naive_padded_grads(net, pairs, prefs, rows):
    """Calls padded to ``rows`` whose padding rows keep their reward.

    As a hand-rolled static-shape loop does when it pads the concatenated
    transitions and sums the padded rewards into the last fragment.
    """
    frags = [f for pair in pairs for f in pair]
    obs = np.concatenate([f.obs[:-1] for f in frags])
    acts = np.concatenate([f.acts for f in frags])
    n = len(acts)
    pad = -n % rows
    obs = np.concatenate([obs, np.zeros((pad, *obs.shape[1:]), obs.dtype)])
    acts = np.concatenate([acts, np.zeros(pad, acts.dtype)])
    dones = np.zeros(n + pad, bool)

    def loss():
        rewards = net(*net.preprocess(obs, acts, obs, dones))
        bounds = np.cumsum([0] + [len(f.acts) for f in frags])
        bounds[-1] = n + pad  # the padding rows join the last fragment
        returns = [rewards[a:b].sum() for a, b in itertools.pairwise(bounds)]
        logits = th.stack(
            [returns[2 * i] - returns[2 * i + 1] for i in range(len(pairs))]
        )
        return th.nn.functional.binary_cross_entropy_with_logits(
            logits, th.as_tensor(prefs)
        )

    return ref.grads_of(net, loss)


def test_compile_padding_rows_have_zero_weight_and_naive_fails(frames_dataset):
    net = make_cnn()
    initial = copy.deepcopy(net)
    grads = one_step_grads(net, frames_dataset, QUICK_COMPILE, minibatch_size=5)
    expected = reference_grads(initial, frames_dataset)
    pairs, prefs = ref.batch_of(frames_dataset, range(len(frames_dataset)))
    naive = naive_padded_grads(copy.deepcopy(initial), pairs, prefs, rows=8)
    assert ref.relative_error(grads, expected) < TOL
    assert ref.relative_error(naive, expected) > 100 * TOL


def test_channels_last_minibatch_means_naive_fails(frames_dataset):
    """With channels_last on, averaging minibatch means is still wrong."""
    net = make_cnn()
    initial = copy.deepcopy(net)
    grads = one_step_grads(net, frames_dataset, dict(channels_last=True))
    expected = reference_grads(initial, frames_dataset)
    pairs, prefs = ref.batch_of(frames_dataset, range(len(frames_dataset)))
    naive_net = copy.deepcopy(initial)
    with acceleration_module.channels_last(naive_net):
        means = [
            ref.full_batch_loss(naive_net, pairs[s : s + 2], prefs[s : s + 2])
            for s in range(0, 5, 2)
        ]
        naive = ref.grads_of(naive_net, lambda: sum(means) / len(means))
    assert ref.relative_error(grads, expected) < TOL
    assert ref.relative_error(naive, expected) > 100 * TOL


def test_channels_last_is_applied_while_training_and_undone(frames_dataset):
    net = make_cnn()
    conv = next(m for m in net.cnn.modules() if isinstance(m, th.nn.Conv2d))
    seen = []

    def record(module, args):
        seen.append(
            (
                module.weight.is_contiguous(memory_format=th.channels_last),
                args[0].is_contiguous(memory_format=th.channels_last),
            ),
        )

    conv.register_forward_pre_hook(record)
    one_step_grads(net, frames_dataset, dict(channels_last=True))
    assert seen and all(weight and inputs for weight, inputs in seen)
    assert conv.weight.is_contiguous()
    assert not net.cnn._forward_pre_hooks


def test_compile_restores_forward_and_keeps_shapes_static(frames_dataset, monkeypatch):
    rows = []

    def fake_compile(function, **kwargs):
        assert kwargs["dynamic"] is False

        def compiled(*args):
            rows.append({len(arg) for arg in args})
            return function(*args)

        return compiled

    monkeypatch.setattr(th, "compile", fake_compile)
    net = make_cnn()
    trainer = make_trainer(
        net,
        batch_size=5,
        minibatch_size=2,
        forward_size=3,
        acceleration=QUICK_COMPILE,
    )
    trainer.train(frames_dataset)
    assert "forward" not in vars(net)  # the class's forward again; pickles
    saved = io.BytesIO()
    th.save(net, saved)  # imitation saves whole nets
    assert saved.tell() > 0
    # Sides of 2 x 4 and 2 x 5 (or 1 x 4 / 1 x 5) transitions in calls of 3: the
    # ragged calls of 1, 2 rows ran padded to 3.
    assert rows and all(sizes == {3} for sizes in rows)


def test_static_shape_forward_pads_and_cuts():
    calls = []

    def function(x, y):
        calls.append((tuple(x.shape), tuple(y.shape)))
        return x.sum(1) + y

    forward = acceleration_module.StaticShapeForward(function)
    x, y = th.ones(8, 2), th.arange(8.0)
    expected = x.sum(1) + y
    for n in (4, 3, 6, 5, 1, 8):
        assert th.equal(forward(x[:n], y[:n]), expected[:n])
    # 3 runs as 4, 5 as 6 and 1 as 4: only calls larger than all before compile.
    assert [shape[0][0] for shape in calls] == [4, 4, 6, 6, 4, 8]
    assert forward.sizes == [4, 6, 8]


def test_cudnn_benchmark_scoped(frames_dataset):
    before = th.backends.cudnn.benchmark
    net = make_cnn()
    seen = []
    net.register_forward_pre_hook(
        lambda module, args: seen.append(th.backends.cudnn.benchmark)
    )
    one_step_grads(net, frames_dataset, dict(cudnn_benchmark=True))
    assert seen and all(seen)
    assert th.backends.cudnn.benchmark == before
    with acceleration_module.cudnn_benchmark():
        assert th.backends.cudnn.benchmark
    assert th.backends.cudnn.benchmark == before


def test_defaults_off_and_parse():
    assert not Acceleration().any
    assert Acceleration.parse(None) == Acceleration()
    options = Acceleration(channels_last=True)
    assert Acceleration.parse(options) is options
    assert Acceleration.parse({"compile": True}) == Acceleration(compile=True)


@pytest.mark.parametrize(
    "value, error, message",
    [
        (
            {"pinned": True},
            ValueError,
            "acceleration.pinned is not an acceleration option",
        ),
        (
            {"compile": 1},
            TypeError,
            r"acceleration\.compile must be a bool \(True or False\)",
        ),
        ({"compile_backend": ""}, ValueError, "acceleration.compile_backend"),
        ("all", TypeError, "acceleration must be an Acceleration"),
    ],
)
def test_bad_options_named_before_training(value, error, message):
    with pytest.raises(error, match=message):
        make_trainer(make_cnn(), acceleration=value)


@pytest.mark.parametrize("field", ["pinned_staging", "compile", "reuse_host_memory"])
def test_numpy_bools_are_bools_and_strings_are_refused(field):
    options = Acceleration(**{field: np.True_})
    assert getattr(options, field) is True
    assert options == Acceleration(**{field: True})
    assert Acceleration.parse({field: np.False_}) == Acceleration(**{field: False})
    for value in ("false", "True", 1, None):
        with pytest.raises(
            TypeError,
            match=rf"^acceleration\.{field} must be a bool \(True or False\), got "
            rf"{re.escape(repr(value))}",
        ):
            Acceleration(**{field: value})


def test_bad_options_named_with_config_key():
    with pytest.raises(ValueError, match=r"reward_trainer_kwargs\.acceleration\.x "):
        Acceleration.parse({"x": True}, "reward_trainer_kwargs.acceleration")
    with pytest.raises(TypeError, match=r"algorithm_kwargs\.acceleration\.compile "):
        Acceleration.parse({"compile": "yes"}, "algorithm_kwargs.acceleration")


def test_options_checked_against_the_net():
    mlp = BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE)
    with pytest.raises(ValueError, match=r"acceleration\.channels_last=True needs"):
        make_trainer(mlp, acceleration=dict(channels_last=True))
    normalized = BasicRewardNet(
        ref.OBS_SPACE, ref.ACT_SPACE, normalize_input_layer=networks.RunningNorm
    )
    with pytest.raises(ValueError, match=r"acceleration\.compile=True: .*RunningNorm"):
        make_trainer(normalized, acceleration=dict(compile=True))
    with pytest.raises(ValueError, match="activation_checkpointing"):
        make_trainer(
            make_cnn(),
            acceleration=dict(compile=True),
            activation_checkpointing=True,
        )
