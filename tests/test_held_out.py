"""The held-out accuracy: non-tied pairs only, labelled by the environment's reward."""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.rewards import reward_nets

from imitation_accum.preference import held_out

OBS = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
ACTS = gym.spaces.Discrete(2)


class FirstObservation(reward_nets.RewardNet):
    """Reward = the observation's value; a scale parameter keeps it a module."""

    def __init__(self) -> None:
        super().__init__(OBS, ACTS)
        self.scale = th.nn.Parameter(th.ones(()))

    def forward(self, state, action, next_state, done):
        return self.scale * state[:, 0]


def fragment(net_rewards, true_rewards):
    """A fragment of net rewards ``net_rewards`` and true rewards ``true_rewards``."""
    obs = np.array([*net_rewards, 0.0], np.float32)[:, None]
    return types.TrajectoryWithRew(
        obs=obs,
        acts=np.zeros(len(net_rewards), np.int64),
        infos=None,
        terminal=False,
        rews=np.array(true_rewards, np.float32),
    )


def test_accuracy_counts_only_non_tied_pairs_and_even_odds_as_wrong():
    # (net returns, true returns) per pair, written out so the count is plain.
    cases = [
        ((2.0, 1.0), (0.0, -1.0)),  # right
        ((0.0, 3.0), (-1.0, 0.0)),  # right
        ((5.0, 1.0), (-1.0, 0.0)),  # wrong
        ((1.0, 1.0), (0.0, -1.0)),  # net even: wrong
        ((4.0, 0.0), (0.0, 0.0)),  # tied: dropped
        ((0.0, 4.0), (-1.0, -1.0)),  # tied: dropped
    ]
    pairs = [
        (fragment([n1 / 2, n1 / 2], [t1, 0.0]), fragment([n2 / 2, n2 / 2], [t2, 0.0]))
        for (n1, n2), (t1, t2) in cases
    ]
    net = FirstObservation()
    model = pc.PreferenceModel(net)
    result = held_out.accuracy(model, pairs)
    assert result == {held_out.ACCURACY: 2 / 4, held_out.NON_TIED: 4}
    assert net.training  # evaluated in eval mode, then restored


def test_accuracy_of_only_ties_is_none():
    pairs = [(fragment([1.0], [0.0]), fragment([0.0], [0.0]))] * 3
    result = held_out.accuracy(pc.PreferenceModel(FirstObservation()), pairs)
    assert result == {held_out.ACCURACY: None, held_out.NON_TIED: 0}


def test_true_returns_are_discounted_from_each_fragment_start():
    pair = (fragment([0.0, 0.0], [1.0, 1.0]), fragment([0.0, 0.0], [0.0, 2.0]))
    returns = held_out.true_returns([pair], 0.5)
    np.testing.assert_allclose(returns, [[1.5, 1.0]])


class _Generator:
    """Trajectories with known rewards; records the steps asked."""

    def __init__(self) -> None:
        self.asked = []

    def sample(self, steps):
        self.asked.append(steps)
        rews = np.arange(steps, dtype=np.float32) % 3 - 1.0
        return [fragment(list(rews), list(rews))]


def test_evaluate_samples_fresh_pairs_and_scores_the_net(rng):
    generator = _Generator()
    model = pc.PreferenceModel(FirstObservation())  # net reward = true reward
    result = held_out.evaluate(
        generator, model, num_pairs=20, fragment_length=4, rng=rng
    )
    assert generator.asked == [2 * 20 * 4]
    assert 0 < result[held_out.NON_TIED] <= 20
    assert result[held_out.ACCURACY] == pytest.approx(1.0)
    # A net of the opposite sign is always wrong.
    with th.no_grad():
        model.model.scale.fill_(-1.0)
    result = held_out.evaluate(
        generator, model, num_pairs=20, fragment_length=4, rng=rng
    )
    assert result[held_out.ACCURACY] == pytest.approx(0.0)
