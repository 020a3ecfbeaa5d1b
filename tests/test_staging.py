"""Staging: the next chunk's inputs start moving before this chunk computes.

The order of copies and waits is checked with a recording transport; the CPU
transport is a pass-through (same values, same dtypes); staged rows slice as the
layout gathers; and trainers with ``pinned_staging`` on give the updates they give
without it, which the other tests compare with full-batch references.
"""

import copy

import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons
from imitation.rewards.reward_nets import BasicRewardNet

import imitation_accum
from imitation_accum.engine import staging
from imitation_accum.preference import pair_table, pair_task
from tests import adversarial_setup as setup
from tests import reference as ref
from tests.test_adversarial_training import (
    frames_net,
    frames_setup,
    plain_full_batch_update,
)


class RecordingTransport:
    """Synchronous copies that log when each chunk is sent and waited for."""

    def __init__(self, log):
        self.log = log

    def send(self, arrays):
        self.log.append(("send", int(arrays[0][0])))
        return staging.Pending(
            [th.as_tensor(a) for a in arrays], event=int(arrays[0][0])
        )

    def wait(self, pending):
        self.log.append(("wait", pending.event))
        return pending.tensors


def test_next_chunk_is_sent_before_this_one_computes():
    log = []
    stager = staging.Stager(RecordingTransport(log))
    chunks = [np.full(3, k) for k in range(3)]
    stager.schedule(chunks, lambda c: [c], th.device("cpu"))
    for k, chunk in enumerate(chunks):
        (tensor,) = stager.fetch(chunk)
        assert th.equal(tensor, th.full((3,), k))
        log.append(("compute", k))
    assert log == [
        ("send", 0),
        ("wait", 0),
        ("send", 1),
        ("compute", 0),
        ("wait", 1),
        ("send", 2),
        ("compute", 1),
        ("wait", 2),
        ("compute", 2),
    ]


def test_second_pass_and_new_schedule_copy_again():
    log = []
    stager = staging.Stager(RecordingTransport(log))
    chunks = [np.full(2, k) for k in range(2)]
    stager.schedule(chunks, lambda c: [c], th.device("cpu"))
    for chunk in chunks + chunks:  # a second pass over the same chunks
        stager.fetch(chunk)
    assert log == [
        ("send", 0),
        ("wait", 0),
        ("send", 1),
        ("wait", 1),
        ("send", 0),
        ("wait", 0),
        ("send", 1),
        ("wait", 1),
    ]
    log.clear()
    stager.fetch(chunks[0])  # prefetches chunks[1] ...
    stager.schedule(chunks[1:], lambda c: [c + 10], th.device("cpu"))
    (tensor,) = stager.fetch(chunks[1])  # ... which the new schedule drops
    assert int(tensor[0]) == 11
    assert log[-3:] == [("wait", 1), ("send", 11), ("wait", 11)]  # 1: dropped


def test_host_transport_is_a_pass_through():
    frames = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    frames.flags.writeable = False  # as memory-mapped frames are
    stager = staging.Stager()
    chunk = (frames, None, np.array([True, False]))
    stager.schedule([chunk], list, th.device("cpu"))
    obs, nothing, dones = stager.fetch(chunk)
    assert obs.dtype == th.uint8 and obs.device.type == "cpu"
    assert np.array_equal(obs.numpy(), frames) and nothing is None
    assert dones.dtype == th.bool and dones.tolist() == [True, False]


@pytest.mark.parametrize("next_obs", [True, False])
def test_staged_rows_gather_as_the_layout_does(rng, next_obs):
    dataset = ref.make_dataset(rng, 3, (2, 5, 3))
    frags = [
        f for i in range(3) for f in (dataset.fragments1[i], dataset.fragments2[i])
    ]
    layout = pair_table.FragmentLayout.of(frags)
    stager = staging.Stager()
    chunk = "chunk"
    offset = 4
    ranges = [(layout, offset, layout.n_transitions)]
    stager.schedule(
        [chunk],
        lambda c: staging.range_arrays(ranges, next_obs=next_obs),
        th.device("cpu"),
    )
    (rows,) = staging.staged_rows(ranges, stager.fetch(chunk))
    assert rows.n_transitions == layout.n_transitions
    for start, stop in [(4, 6), (5, 11), (offset, layout.n_transitions), (9, 10)]:
        staged = rows.gather(start, stop, next_obs=next_obs)
        gathered = layout.gather(start, stop, next_obs=next_obs)
        for s, g in zip(staged, gathered):
            assert (s is None) == (g is None)
            if g is not None:
                assert np.array_equal(s.numpy(), g)
    if not next_obs:
        with pytest.raises(ValueError, match="next observations were not staged"):
            rows.gather(4, 6, next_obs=True)


@pytest.mark.parametrize("two_pass", [False, True])
def test_preference_training_unchanged_by_staging(rng, two_pass):
    from tests.test_acceleration import FRAMES, make_cnn, make_trainer

    dataset = ref.make_dataset(rng, 6, (4, 5), obs_space=FRAMES)
    nets = []
    for acceleration in (None, dict(pinned_staging=True)):
        th.manual_seed(0)
        net = make_cnn()
        trainer = make_trainer(
            net,
            batch_size=4,
            epochs=2,
            forward_size=3,
            two_pass=two_pass,
            minibatch_size=None if two_pass else 3,
            acceleration=acceleration,
        )
        trainer.train(dataset)
        nets.append(ref.flat(net.parameters()))
    assert th.equal(nets[0], nets[1])


@pytest.mark.parametrize(
    "options",
    [
        dict(pinned_staging=True),
        dict(channels_last=True),
        dict(compile=True, compile_backend="aot_eager"),
        dict(
            pinned_staging=True,
            channels_last=True,
            cudnn_benchmark=True,
            compile=True,
            compile_backend="aot_eager",
        ),
    ],
    ids=["pinned_staging", "channels_last", "compile", "all"],
)
@pytest.mark.parametrize("algo", ["AIRL", "GAIL"])
def test_discriminator_options_give_full_batch_update(algo, options, rng):
    venv, ppo = frames_setup()
    net = frames_net(algo, venv)
    expert, gen = setup.sample_sequence(rng, 1, 6, venv)[0]
    accumulating = {"AIRL": imitation_accum.AIRL, "GAIL": imitation_accum.GAIL}
    trainer = setup.make_trainer(
        accumulating[algo],
        net,
        venv=venv,
        gen_algo=ppo,
        demo_batch_size=6,
        demo_minibatch_size=4,  # chunks of 8 and 4 transitions: the last padded
        lr=1.0,
        acceleration=options,
    )
    trainer.train_disc(expert_samples=expert, gen_samples=gen)
    reference = copy.deepcopy(net)
    plain_full_batch_update(algo, reference, ppo.policy, expert, gen, lr=1.0)
    assert setup.update_error(net, trainer._reward_net, reference) < 1e-4
    assert "forward" not in vars(trainer._reward_net)


def test_discriminator_bad_option_named():
    venv, ppo = frames_setup()
    with pytest.raises(ValueError, match=r"acceleration\.pinned "):
        setup.make_trainer(
            imitation_accum.GAIL,
            frames_net("GAIL", venv),
            venv=venv,
            gen_algo=ppo,
            demo_batch_size=4,
            acceleration={"pinned": True},
        )


@pytest.mark.skipif(not th.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_transport_copies_through_pinned_buffers():
    device = th.device("cuda")
    stager = staging.Stager()
    chunks = [np.full((64, 84, 84, 4), k, dtype=np.uint8) for k in range(4)]
    stager.schedule(chunks, lambda c: [c, None], device)
    assert isinstance(stager.transport, staging.CudaTransport)
    for k, chunk in enumerate(chunks):
        frames, nothing = stager.fetch(chunk)
        assert frames.dtype == th.uint8 and frames.device.type == "cuda"
        assert nothing is None and int(frames.float().mean()) == k


@pytest.mark.parametrize("whole_table", [True, False])
@pytest.mark.parametrize("varying", ["lengths", "terminal"])
@pytest.mark.parametrize("discount", [1.0, 0.9])
def test_batch_converted_once_splits_as_chunks_gathered_apart(
    rng, discount, varying, whole_table, monkeypatch
):
    # Batches of one size drawn afresh, cut alike, whose pairs differ only in
    # lengths or only in terminal flags: a chunk placement cached for one batch
    # must not serve another. Without the whole table converted once (a dataset
    # too large for it), each batch is converted on its own.
    if not whole_table:
        monkeypatch.setattr(pair_task, "CONVERTED_TABLE_BYTES", 0)
    pairs = []
    for k in range(12):
        lengths = (3 + k % 4, 2 + k % 5) if varying == "lengths" else (4, 4)
        terminal = (k % 3 == 0, k % 4 == 1) if varying == "terminal" else (0, 0)
        pairs.append(
            tuple(
                ref.make_fragment(rng, length, terminal=bool(flag))
                for length, flag in zip(lengths, terminal)
            )
        )
    data = preference_comparisons.PreferenceDataset()
    data.push(pairs, rng.uniform(size=len(pairs)).astype(np.float32))
    net = BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE, use_next_state=True)
    task = pair_task.PreferenceTask(
        net, noise_prob=0.0, discount_factor=discount, threshold=50.0
    )
    table = pair_table.read_preferences(data)
    item_chunks = [slice(0, 2), slice(2, 6)]
    for _ in range(8):
        local = rng.permutation(len(table))[:6]
        assert task.converted_batches.applies(table, local)
        staged = task.converted_batches.chunks(table, local, item_chunks, 3)
        for chunk, items in zip(staged, item_chunks):
            apart = task.make_chunk(table, local[items], 3)
            assert th.equal(chunk.preferences, apart.preferences)
            assert th.equal(chunk.prefers_first, apart.prefers_first)
            for side in (0, 1):
                layout, expected = chunk.layouts[side], apart.layouts[side]
                np.testing.assert_array_equal(layout.offsets, expected.offsets)
                np.testing.assert_array_equal(layout.dones, expected.dones)
                assert layout.uniform_length == expected.uniform_length
                gathered = task.convert(expected, 0, expected.n_transitions)
                for got, want in zip(chunk.converted_inputs[side], gathered):
                    assert th.equal(got, want)
                weights = chunk.discounts[side]
                if discount == 1:
                    assert weights is None and apart.discounts[side] is None
                else:
                    assert th.equal(weights, apart.discounts[side])
