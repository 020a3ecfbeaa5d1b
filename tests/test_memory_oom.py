"""Out-of-memory back-off: the redone step equals an uninterrupted one.

CUDA's out-of-memory error is simulated on the CPU by a reward net that raises
``torch.cuda.OutOfMemoryError`` when a forward with gradient sees more than a set
number of transitions, after computing it (so that a failed attempt has already
used dropout's RNG and, for a single call, updated its ``RunningNorm``).
"""

import copy

import pytest
import torch as th
from imitation.rewards.reward_nets import BasicRewardNet
from imitation.util import networks

from imitation_accum.engine import accumulator, norm_replay
from tests import reference as ref
from tests.test_preference_exactness import TOL, make_trainer


class OutOfMemoryAbove(BasicRewardNet):
    """Raises CUDA's out-of-memory error on calls with gradient above ``limit``."""

    def __init__(self, *args, limit: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit = limit
        self.raised = 0

    def forward(self, state, action, next_state, done):
        rewards = super().forward(state, action, next_state, done)
        if th.is_grad_enabled() and len(state) > self.limit:
            self.raised += 1
            raise th.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return rewards


def make_oom_net(limit, **kwargs):
    th.manual_seed(0)
    return OutOfMemoryAbove(
        ref.OBS_SPACE,
        ref.ACT_SPACE,
        hid_sizes=(16, 16),
        limit=limit,
        normalize_input_layer=networks.RunningNorm,
        dropout_prob=0.3,
        **kwargs,
    )


def train_sgd(net, dataset, seed=5, **kwargs):
    trainer = make_trainer(
        net,
        batch_size=4,
        epochs=2,
        optimizer_cls=th.optim.SGD,
        lr=0.05,
        **kwargs,
    )
    th.manual_seed(seed)
    trainer.train(dataset)
    return trainer


def relative_update_error(net, expected_net, initial):
    """||update - expected update|| / ||expected update||, over the parameters."""
    start = list(initial.parameters())
    update = [p - q for p, q in zip(net.parameters(), start)]
    expected = [p - q for p, q in zip(expected_net.parameters(), start)]
    return ref.relative_error(update, expected)


def test_redone_steps_equal_uninterrupted_ones(rng, monkeypatch):
    # The threads chosen: no probe for them, whose calls the net would count.
    monkeypatch.setenv("OMP_NUM_THREADS", str(th.get_num_threads()))
    dataset = ref.make_dataset(rng, 8, (5, 3))  # pairs of 8 transitions
    net = make_oom_net(limit=2)
    initial = copy.deepcopy(net)
    unlimited = copy.deepcopy(net)
    unlimited.limit = 10**9
    # One call over the whole batch first (the norm layer updates itself), then
    # halving: 2-pair chunks (16), 1-pair chunks (8), two passes of 4, then of 2.
    trainer = train_sgd(net, dataset, forward_size=100)
    rng_after = th.get_rng_state()
    assert net.raised == 4
    assert trainer.step_policy.chunk_cap == 2
    logged = trainer.logger.name_to_value
    assert logged["reward/final/train/two_pass"] == 1.0
    assert logged["reward/final/train/chunk_transitions"] == 2
    # What the policy ended with, run from the start without any failure.
    train_sgd(unlimited, dataset, two_pass=True, forward_size=2)
    assert th.equal(th.get_rng_state(), rng_after)  # the same dropout draws
    assert unlimited.raised == 0
    assert relative_update_error(net, unlimited, initial) < TOL
    for name, value in ref.buffers(unlimited).items():
        th.testing.assert_close(dict(net.named_buffers())[name], value)


def buffers_after_a_step_failing_after_its_norm_update(dataset, monkeypatch):
    """Norm buffers after step 1, and after step 2 fails once they are committed."""
    net = make_oom_net(limit=10**9)
    trainer = make_trainer(
        net, batch_size=4, epochs=1, optimizer_cls=th.optim.SGD, forward_size=3
    )
    after_first = []
    step = trainer.engine.step

    def recording_step(*args, **kwargs):
        result = step(*args, **kwargs)
        after_first.append(ref.buffers(net))
        return result

    trainer.engine.step = recording_step
    measured = [0]
    clip = accumulator.clip_and_measure

    def failing_second(params, max_grad_norm):
        measured[0] += 1  # runs after the step's norm statistics are committed
        return float("nan") if measured[0] == 2 else clip(params, max_grad_norm)

    monkeypatch.setattr(accumulator, "clip_and_measure", failing_second)
    with pytest.raises(FloatingPointError, match="non-finite gradient norm"):
        trainer.train(dataset)
    return after_first[0], ref.buffers(net)


def test_redoing_without_restoring_norm_buffers_fails(rng, monkeypatch):
    """A failed step's committed norm update is undone; without the restore, not.

    (A preference step calls the net at least twice, one call per side, so its
    norm layers never update themselves during the chunks: the statistics change
    only once the step has run all of them, and a failure after that is what the
    restore undoes.)
    """
    dataset = ref.make_dataset(rng, 8, (5, 3))
    first, failed = buffers_after_a_step_failing_after_its_norm_update(
        dataset, monkeypatch
    )
    assert all(th.equal(failed[k], first[k]) for k in first)
    monkeypatch.setattr(norm_replay.NormReplay, "restore", lambda self, snap: None)
    first, failed = buffers_after_a_step_failing_after_its_norm_update(
        dataset, monkeypatch
    )
    key = "mlp.normalize_input.count"
    assert failed[key] > first[key]


def test_out_of_memory_at_one_transition_stops_with_a_clear_error(rng):
    dataset = ref.make_dataset(rng, 4, (3,))
    net = make_oom_net(limit=0)
    initial = copy.deepcopy(net)
    trainer = make_trainer(net, batch_size=4, forward_size=8)
    with pytest.raises(th.OutOfMemoryError, match="one transition"):
        trainer.train(dataset)
    assert ref.relative_error(list(net.parameters()), list(initial.parameters())) == 0
    for name, value in ref.buffers(initial).items():
        assert th.equal(dict(net.named_buffers())[name], value)
