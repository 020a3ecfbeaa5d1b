"""Two passes over chunks that split fragments give the full-batch update.

Chunks are ranges of the batch's concatenated transitions, cut at arbitrary
points (inside fragments, across pairs); each is checked against the independent
full-batch reference of tests/reference.py, and the naive variants (pass 2 without
rewinding the RNG, passes that update norm statistics themselves, discount weights
counted from the chunk's start) fail the same checks.
"""

import copy

import numpy as np
import pytest
import torch as th
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from imitation.util import networks

from imitation_accum.preference import pair_table
from tests import reference as ref
from tests.test_memory import budget_for
from tests.test_preference_exactness import TOL, make_net, make_trainer


def two_pass_grads(net, dataset, *, chunk, **kwargs):
    """Gradients of one two-pass step over the whole dataset (left in .grad)."""
    kwargs.setdefault("optimizer_cls", th.optim.SGD)
    kwargs.setdefault("lr", 1e-9)  # .grad is what is compared
    trainer = make_trainer(
        net,
        batch_size=len(dataset),
        two_pass=True,
        forward_size=chunk,
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
    batch_size=st.integers(1, 6),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    discount=st.sampled_from([1.0, 0.9, 0.5]),
    noise=st.sampled_from([0.0, 0.1]),
    chunk=st.integers(1, 13),
)
def test_two_pass_gradient_equals_full_batch(
    batch_size, lengths, discount, noise, chunk
):
    rng = np.random.default_rng(batch_size * 100 + sum(lengths) + chunk)
    dataset = ref.make_dataset(rng, batch_size, lengths)
    th.manual_seed(0)
    net = make_net()
    initial = copy.deepcopy(net)
    grads, trainer = two_pass_grads(
        net, dataset, chunk=chunk, discount=discount, noise=noise
    )
    pairs, prefs = ref.batch_of(dataset, range(batch_size))
    full = ref.full_batch_loss(
        initial, pairs, prefs, discount=discount, noise_prob=noise
    )
    expected = ref.grads_of(initial, lambda: full)
    assert ref.relative_error(grads, expected) < TOL
    logged = trainer.logger.name_to_value
    assert logged["reward/final/train/two_pass"] == 1.0
    loss = float(full.detach())
    assert logged["reward/final/train/loss"] == pytest.approx(loss, rel=1e-5)


def test_chunks_split_fragments_at_awkward_points(rng):
    """Unequal fragments, cut mid-fragment and across pairs, with discounting."""
    dataset = ref.make_dataset(rng, 4, (7, 2, 11, 5), binary=True)
    lengths = [
        len(f.acts)
        for pair in zip(dataset.fragments1, dataset.fragments2)
        for f in pair
    ]
    total = sum(lengths)
    boundaries = set(np.cumsum(lengths)[:-1])
    chunk = 3  # cuts at 3, 6, 9, ...: inside fragments and on some boundaries
    cuts = set(range(chunk, total, chunk))
    assert cuts - boundaries and lengths[0] % chunk  # some cuts split fragments
    net = make_net()
    initial = copy.deepcopy(net)
    grads, trainer = two_pass_grads(net, dataset, chunk=chunk, discount=0.9)
    pairs, prefs = ref.batch_of(dataset, range(4))
    expected = ref.grads_of(
        initial, lambda: ref.full_batch_loss(initial, pairs, prefs, discount=0.9)
    )
    assert ref.relative_error(grads, expected) < TOL
    assert trainer.logger.name_to_value["reward/final/train/chunks_per_step"] == (
        -(-total // chunk)
    )


def test_discount_counted_from_the_chunk_start_fails(rng):
    """Weights gamma^t must count t from the fragment's start, not the chunk's."""
    dataset = ref.make_dataset(rng, 3, (8, 5))
    net = make_net()
    initial = copy.deepcopy(net)
    pairs, prefs = ref.batch_of(dataset, range(3))
    expected = ref.grads_of(
        initial, lambda: ref.full_batch_loss(initial, pairs, prefs, discount=0.8)
    )
    grads, _ = two_pass_grads(net, dataset, chunk=3, discount=0.8)
    assert ref.relative_error(grads, expected) < TOL

    # Naive, written here: t counted from the start of each chunk of 3.
    def chunk_local():
        rewards = side_rewards(initial, pairs, 3)
        returns = [
            side_returns(rewards[side], pairs, side, discount=0.8, chunk=3)
            for side in (0, 1)
        ]
        return pair_loss(returns, prefs)

    naive = ref.grads_of(initial, chunk_local)
    assert ref.relative_error(naive, expected) > 100 * TOL


def side_rewards(net, pairs, call_size):
    """Per-transition rewards of each side, in calls of ``call_size``, sides in turn.

    With dropout, this is the forward whose masks the trainer must reproduce: the
    same calls, with the same shapes, in the same order, from the same RNG state.
    The first fragments are laid end to end, and so are the second fragments;
    call ``k`` of the first side comes before call ``k`` of the second.
    """
    sides = []
    for side in (0, 1):
        frags = [pair[side] for pair in pairs]
        sides.append(
            (
                np.concatenate([f.obs[:-1] for f in frags]),
                np.concatenate([f.acts for f in frags]),
                np.concatenate([f.obs[1:] for f in frags]),
            )
        )
    outputs = ([], [])
    longest = max(len(acts) for _, acts, _ in sides)
    for s in range(0, longest, call_size):
        for side, (obs, acts, next_obs) in enumerate(sides):
            if s < len(acts):
                e = min(s + call_size, len(acts))
                dones = np.zeros(e - s, dtype=bool)
                outputs[side].append(
                    net(*net.preprocess(obs[s:e], acts[s:e], next_obs[s:e], dones))
                )
    return th.cat(outputs[0]), th.cat(outputs[1])


def side_returns(rewards, pairs, side, *, discount=1.0, chunk=None):
    """Discounted returns of one side's fragments, laid end to end in ``rewards``.

    ``t`` counts from each fragment's first transition; with ``chunk`` (the
    naive variant) it counts from the start of the chunk of ``chunk`` transitions
    of the side that holds the transition instead.
    """
    returns, start = [], 0
    for pair in pairs:
        n = len(pair[side].acts)
        t = np.arange(n) if chunk is None else (start + np.arange(n)) % chunk
        weights = th.tensor(discount**t, dtype=th.float32)
        returns.append((rewards[start : start + n] * weights).sum())
        start += n
    return th.stack(returns)


def pair_loss(returns, prefs):
    """Mean cross-entropy of the pairs, from (first, second) side returns."""
    losses = []
    for i, pref in enumerate(prefs):
        diff = returns[1][i] - returns[0][i]
        p = 1 / (1 + th.exp(diff))
        losses.append(-(pref * th.log(p) + (1 - pref) * th.log(1 - p)))
    return th.stack(losses).mean()


def calls_reference_loss(net, pairs, prefs, call_size, *, discount=1.0):
    """One training forward of the batch in calls of ``call_size`` (side_rewards)."""
    rewards = side_rewards(net, pairs, call_size)
    returns = [
        side_returns(rewards[side], pairs, side, discount=discount) for side in (0, 1)
    ]
    return pair_loss(returns, prefs)


def naive_two_pass_grads(net, pairs, prefs, call_size, *, between=None):
    """Two passes written plainly, with nothing restored between them.

    Pass 1 computes the returns without grad (the net's norm layers update their
    statistics as they see each call, dropout draws from the RNG as it stands);
    the loss's gradient with respect to the returns is taken once; pass 2 runs
    the calls again with grad (updating the norms again, drawing new masks,
    unless ``between`` rewinds what it names) and back-propagates it.
    """
    params = list(net.parameters())
    with th.no_grad():
        rewards = side_rewards(net, pairs, call_size)
        first = [side_returns(rewards[side], pairs, side) for side in (0, 1)]
    first = [r.requires_grad_() for r in first]
    upstream = th.autograd.grad(pair_loss(first, prefs), first)
    if between is not None:
        between()
    rewards = side_rewards(net, pairs, call_size)
    second = [side_returns(rewards[side], pairs, side) for side in (0, 1)]
    grads = th.autograd.grad(second, params, upstream, allow_unused=True)
    return [th.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def test_dropout_masks_are_the_same_in_both_passes(rng):
    dataset = ref.make_dataset(rng, 3, (6, 4))
    net = make_net(dropout_prob=0.5)
    initial = copy.deepcopy(net)
    pairs, prefs = ref.batch_of(dataset, range(3))
    th.manual_seed(123)
    expected = ref.grads_of(
        initial, lambda: calls_reference_loss(initial, pairs, prefs, 4, discount=0.9)
    )
    th.manual_seed(123)
    grads, _ = two_pass_grads(net, dataset, chunk=4, discount=0.9)
    assert ref.relative_error(grads, expected) < TOL
    # The reference's masks matter: another seed is another update.
    th.manual_seed(124)
    other = ref.grads_of(
        initial, lambda: calls_reference_loss(initial, pairs, prefs, 4, discount=0.9)
    )
    assert ref.relative_error(other, expected) > 100 * TOL


def test_pass_two_without_rewinding_the_rng_fails(rng):
    dataset = ref.make_dataset(rng, 3, (6, 4))
    net = make_net(dropout_prob=0.5)
    initial = copy.deepcopy(net)
    pairs, prefs = ref.batch_of(dataset, range(3))
    th.manual_seed(123)
    expected = ref.grads_of(
        initial, lambda: calls_reference_loss(initial, pairs, prefs, 4)
    )
    th.manual_seed(123)
    grads, _ = two_pass_grads(net, dataset, chunk=4)
    assert ref.relative_error(grads, expected) < TOL
    # Written plainly, two passes are exact when pass 2 rewinds the RNG...
    th.manual_seed(123)
    rewound = naive_two_pass_grads(
        copy.deepcopy(initial), pairs, prefs, 4, between=lambda: th.manual_seed(123)
    )
    assert ref.relative_error(rewound, expected) < TOL
    # ...and naive when it starts where pass 1 left the RNG: other dropout masks.
    th.manual_seed(123)
    naive = naive_two_pass_grads(copy.deepcopy(initial), pairs, prefs, 4)
    assert ref.relative_error(naive, expected) > 100 * TOL


@pytest.mark.parametrize("norm", [networks.RunningNorm, networks.EMANorm])
def test_norm_statistics_are_the_full_batch_ones_in_both_passes(rng, norm):
    dataset = ref.make_dataset(rng, 4, (5, 3))
    net = make_net(normalize_input_layer=norm)
    reference_net = copy.deepcopy(net)
    pairs, prefs = ref.batch_of(dataset, range(4))
    expected = ref.grads_of(
        reference_net,
        lambda: ref.full_batch_loss(reference_net, pairs, prefs),
    )
    grads, _ = two_pass_grads(net, dataset, chunk=3)
    assert ref.relative_error(grads, expected) < TOL
    for name, value in ref.buffers(reference_net).items():
        th.testing.assert_close(dict(net.named_buffers())[name], value)


def test_passes_updating_norms_themselves_fail(rng):
    dataset = ref.make_dataset(rng, 4, (5, 3))
    net = make_net(normalize_input_layer=networks.RunningNorm)
    reference_net = copy.deepcopy(net)
    naive_net = copy.deepcopy(net)
    pairs, prefs = ref.batch_of(dataset, range(4))
    expected = ref.grads_of(
        reference_net,
        lambda: ref.full_batch_loss(reference_net, pairs, prefs),
    )
    grads, _ = two_pass_grads(net, dataset, chunk=3)
    assert ref.relative_error(grads, expected) < TOL
    for name, value in ref.buffers(reference_net).items():
        th.testing.assert_close(dict(net.named_buffers())[name], value)
    # Naive, written here: no pre-pass; every call of both passes updates the
    # statistics itself.
    naive = naive_two_pass_grads(naive_net, pairs, prefs, 3)
    assert ref.relative_error(naive, expected) > 100 * TOL
    moved = ref.buffers(naive_net)
    assert any(
        not th.allclose(moved[name], value, rtol=1e-4)
        for name, value in ref.buffers(reference_net).items()
    )


def test_one_and_two_passes_log_the_same_figures(rng):
    dataset = ref.make_dataset(rng, 6, (4, 7), binary=True)
    net = make_net()
    figures = []
    for two_pass in (False, True):
        trainer = make_trainer(
            copy.deepcopy(net),
            batch_size=6,
            two_pass=two_pass,
            forward_size=5,
            optimizer_cls=th.optim.SGD,
            max_grad_norm=0.1,
        )
        trainer.train(dataset)
        logged = trainer.logger.name_to_value
        figures.append(
            [
                logged[f"reward/final/train/{k}"]
                for k in ("loss", "accuracy", "grad_norm")
            ]
        )
        params = [p.detach().clone() for p in trainer._task.net.parameters()]
        figures[-1].append(params)
    (loss1, acc1, norm1, p1), (loss2, acc2, norm2, p2) = figures
    assert loss1 == pytest.approx(loss2, rel=1e-6)
    assert acc1 == acc2
    assert norm1 == pytest.approx(norm2, rel=1e-5)
    assert ref.relative_error(p2, p1) < 1e-6


def test_range_sums_tile_into_segment_sums(rng):
    lengths = np.array([3, 1, 6, 2])
    layout = pair_table.FragmentLayout.from_arrays(
        [None] * 4, lengths, np.zeros(4, bool)
    )
    values = th.as_tensor(rng.normal(size=int(lengths.sum())))
    whole = layout.segment_sums(values)
    for size in (1, 2, 4, 5, 12):
        parts = [
            layout.range_sums(values[s : s + size], s, min(s + size, 12))
            for s in range(0, 12, size)
        ]
        th.testing.assert_close(sum(parts), whole)
    first, pieces = layout.pieces(2, 9)
    assert first == 0 and pieces.tolist() == [1, 1, 5]


def nan_reward_when_marked(net, marker, *, only_with_grad):
    """The net's reward is NaN for inputs equal to ``marker`` (in some forwards)."""

    def hook(module, inputs, output):
        if only_with_grad and not th.is_grad_enabled():
            return output  # pass 1 (no gradient) sees finite rewards
        bad = (inputs[0] == marker).all(dim=1)
        return th.where(bad, th.full_like(output, float("nan")), output)

    net.register_forward_hook(hook)


@pytest.mark.parametrize("only_with_grad", [False, True])
def test_a_nan_reward_fails_a_two_pass_step_as_it_fails_one_pass(rng, only_with_grad):
    """The step meeting the NaN is discarded: state as after the last step."""
    dataset = ref.make_dataset(rng, 12, (5, 3))
    dataset.fragments2[7].obs[2] = 7.25
    net = make_net()
    runs = {}
    for name, kwargs in (
        ("one pass", {}),
        ("two passes", {"memory_budget": budget_for(net, dataset, 4)}),
    ):
        trained = copy.deepcopy(net)
        nan_reward_when_marked(trained, 7.25, only_with_grad=only_with_grad)
        trainer = make_trainer(trained, batch_size=2, forward_size=4, **kwargs)
        before = []
        original = trainer.engine.step

        def record_then_step(
            *args, trainer=trainer, original=original, before=before, **kw
        ):
            before.append(
                (
                    copy.deepcopy(trainer._task.net.state_dict()),
                    copy.deepcopy(trainer.optim.state_dict()),
                )
            )
            return original(*args, **kw)

        trainer.engine.step = record_then_step
        with pytest.raises(FloatingPointError, match="non-finite loss"):
            trainer.train(dataset)
        params, optim = before[-1]
        for key, value in trained.state_dict().items():
            assert th.equal(value, params[key]), (name, key)
        state, after = optim["state"], trainer.optim.state_dict()["state"]
        assert state.keys() == after.keys()
        for k in state:
            for entry in state[k]:
                assert th.equal(state[k][entry], after[k][entry]), (name, k, entry)
        assert all(p.grad is None for p in trained.parameters())
        runs[name] = (trainer.engine.n_steps, trainer.last_plan.two_pass, trained)
    (steps1, two1, net1), (steps2, two2, net2) = runs["one pass"], runs["two passes"]
    assert (two1, two2) == (False, True)
    assert steps1 == steps2 > 0  # the same step fails, after steps were taken
    assert ref.relative_error(list(net2.parameters()), list(net1.parameters())) < 1e-5
