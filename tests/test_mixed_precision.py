"""autocast_dtype: bfloat16 and float16 forwards.

bfloat16 agrees across minibatch sizes; float16's GradScaler scales every
minibatch and unscales, clips and steps once per batch.
"""

import copy

import numpy as np
import pytest
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet

from imitation_accum.engine import acceleration, accumulator
from tests import reference as ref
from tests.test_preference_exactness import TOL, make_trainer

BF16_TOL = 3e-2  # bfloat16 keeps 8 significant bits
FP16_TOL = 5e-3  # float16 keeps 11


def make_net(hid_sizes=(16, 16)):
    return BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=hid_sizes)


def step_grads(net, dataset, **kwargs):
    kwargs.setdefault("optimizer_cls", th.optim.SGD)
    kwargs.setdefault("lr", 1e-9)
    kwargs.setdefault("forward_size", 4)
    trainer = make_trainer(net, batch_size=len(dataset), **kwargs)
    trainer.train(dataset)
    return ref.param_grads(net), trainer


@pytest.mark.parametrize(
    "split",
    [dict(minibatch_size=1), dict(minibatch_size=3), dict(two_pass=True)],
)
def test_bfloat16_agrees_across_minibatch_sizes(rng, split):
    dataset = ref.make_dataset(rng, 7, (5, 3), binary=True)
    net = make_net(hid_sizes=(64, 64))
    initial = copy.deepcopy(net)
    full, _ = step_grads(copy.deepcopy(net), dataset, autocast_dtype="bfloat16")
    grads, _ = step_grads(net, dataset, autocast_dtype="bfloat16", **split)
    assert ref.relative_error(grads, full) < BF16_TOL
    # The full-batch bfloat16 run is the plainly written one under autocast ...
    pairs, prefs = ref.batch_of(dataset, range(7))

    def autocast_loss():
        with th.autocast("cpu", dtype=th.bfloat16):
            return ref.full_batch_loss(initial, pairs, prefs)

    reference = ref.grads_of(initial, autocast_loss)
    assert ref.relative_error(full, reference) < BF16_TOL
    # ... and really ran in bfloat16: it is not the float32 update.
    float32 = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    assert ref.relative_error(full, float32) > 100 * TOL


@pytest.mark.parametrize("value", ["fp16", "bf16", "float32", th.bfloat16, 16])
def test_unknown_autocast_dtype_is_rejected_by_name(value):
    with pytest.raises(ValueError, match="autocast_dtype"):
        make_trainer(make_net(), autocast_dtype=value)


def test_float16_needs_cuda():
    with pytest.raises(ValueError, match="autocast_dtype='float16' needs a CUDA"):
        make_trainer(make_net(), autocast_dtype="float16")


@pytest.fixture
def float16_on_cpu(monkeypatch):
    """float16 autocast and a GradScaler on the CPU.

    The trainer refuses it, but torch runs it: this exercises the scaler's
    once-per-batch logic here.
    """
    monkeypatch.setattr(acceleration, "check_supported", lambda *args, **kwargs: None)


@pytest.mark.usefixtures("float16_on_cpu")
@pytest.mark.parametrize("minibatch_size", [None, 2])
def test_float16_unscales_and_clips_once_per_batch(rng, minibatch_size):
    dataset = ref.make_dataset(rng, 6, (4,), binary=True)
    net = make_net(hid_sizes=(32, 32))
    initial = copy.deepcopy(net)
    grads, trainer = step_grads(
        net,
        dataset,
        autocast_dtype="float16",
        minibatch_size=minibatch_size,
        max_grad_norm=0.05,
    )
    pairs, prefs = ref.batch_of(dataset, range(6))
    full = ref.grads_of(initial, lambda: ref.full_batch_loss(initial, pairs, prefs))
    norm = float(th.linalg.vector_norm(ref.flat(full)))
    assert norm > 0.05
    # .grad holds the unscaled, clipped full-batch gradient.
    clipped = [g * (0.05 / (norm + 1e-6)) for g in full]
    assert ref.relative_error(grads, clipped) < FP16_TOL
    logged = trainer.logger.name_to_value
    assert logged["reward/final/train/amp_loss_scale"] == 2.0**16
    assert logged["reward/final/train/amp_skipped_steps"] == 0
    assert logged["reward/final/train/grad_norm"] == pytest.approx(norm, rel=FP16_TOL)


@pytest.mark.usefixtures("float16_on_cpu")
def test_float16_overflow_skips_the_step_and_lowers_the_scale(rng):
    dataset = ref.make_dataset(rng, 4, (4,))
    net = make_net()
    initial = copy.deepcopy(net)
    trainer = make_trainer(
        net,
        batch_size=4,
        minibatch_size=2,
        forward_size=4,
        autocast_dtype="float16",
        optimizer_cls=th.optim.SGD,
    )
    trainer.engine.scaler = th.amp.GradScaler("cpu", init_scale=2.0**100)
    trainer.train(dataset)
    assert ref.relative_error(list(net.parameters()), list(initial.parameters())) == 0
    logged = trainer.logger.name_to_value
    assert logged["reward/final/train/amp_skipped_steps"] == 1
    assert logged["reward/final/train/amp_loss_scale"] == 2.0**99
    # The next step trains (scale lowered until the gradients fit).
    trainer.engine.scaler = th.amp.GradScaler("cpu")
    trainer.train(dataset)
    assert ref.relative_error(list(net.parameters()), list(initial.parameters())) > 0


@pytest.mark.usefixtures("float16_on_cpu")
def test_a_failed_float16_step_leaves_the_scale_alone(rng, monkeypatch):
    dataset = ref.make_dataset(rng, 4, (4,))
    net = make_net()
    trainer = make_trainer(
        net,
        batch_size=4,
        forward_size=4,
        autocast_dtype="float16",
        regularizer_factory=None,
    )
    scaler = trainer.engine.scaler
    before = scaler.state_dict()

    def failing_step(*args):
        raise FloatingPointError("after unscale_")

    with monkeypatch.context() as patch:
        patch.setattr(accumulator, "clip_and_measure", failing_step)
        with pytest.raises(FloatingPointError):
            trainer.train(dataset)
    assert scaler.state_dict() == before
    trainer.train(dataset)  # the scaler can unscale again: its record was reset
    assert np.isfinite(trainer.logger.name_to_value["reward/final/train/loss"])
