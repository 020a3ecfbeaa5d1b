"""Whole-dataset checks: every pair against the spaces, named by its file index."""

import copy
import re

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.rewards.reward_nets import BasicRewardNet
from torch.utils import data as data_th

from imitation_accum import PreferenceDataset
from imitation_accum.preference import dataset_checks
from tests import reference as ref
from tests.test_preference_exactness import make_net, make_trainer

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
DISCRETE = gym.spaces.Discrete(2)


def fragment(length=3, obs_dim=4, acts=None):
    obs = np.zeros((length + 1, obs_dim), dtype=np.float32)
    if acts is None:
        acts = np.ones(length, dtype=np.int64)
    return types.TrajectoryWithRew(
        obs=obs,
        acts=np.asarray(acts),
        infos=None,
        terminal=False,
        rews=np.zeros(length, dtype=np.float32),
    )


def dataset(n_pairs=6, broken=None):
    """``n_pairs`` good pairs; ``broken`` maps an index to its first fragment."""
    data = pc.PreferenceDataset()
    firsts = [(broken or {}).get(i, fragment()) for i in range(n_pairs)]
    data.push(
        [(first, fragment()) for first in firsts],
        np.full(n_pairs, 0.5, dtype=np.float32),
    )
    return data


def check(data, action_space=DISCRETE, **kwargs):
    dataset_checks.check_dataset(data, OBS, action_space, **kwargs)


def test_good_dataset_passes():
    data = dataset()
    check(data)  # a false alarm raises
    for i in range(len(data)):
        assert dataset_checks.pair_problems(data[i], OBS, DISCRETE) == [], i
    # The same check is not a no-op: one bad observation in the same data fails it.
    with pytest.raises(ValueError, match=r"1 of 6 pairs do not fit"):
        check(dataset(broken={0: nan_fragment()}))


def edge_dataset(acts, *, length=3, preferences=(0.0, 1.0, 0.5)):
    """Good pairs at the edges: the given actions, unequal lengths, 0 and 1."""
    data = pc.PreferenceDataset()
    data.push(
        [
            (fragment(length, acts=acts), fragment(length + 2, acts=[acts[0]] * 5))
            for _ in preferences
        ],
        np.asarray(preferences, dtype=np.float32),
    )
    return data


@pytest.mark.parametrize(
    ("space", "acts", "beyond"),
    [
        (DISCRETE, np.array([0, 1, 1], dtype=np.int32), [0, 2, 1]),
        (gym.spaces.Discrete(3, start=-1), [-1, 0, 1], [-2, 0, 1]),
        (
            gym.spaces.MultiDiscrete([2, 3]),
            [[0, 0], [1, 2], [1, 1]],
            [[0, 0], [1, 3], [1, 1]],
        ),
        (gym.spaces.MultiBinary(2), [[0, 1], [1, 0], [1, 1]], [[0, 1], [2, 0], [1, 1]]),
        (
            gym.spaces.Box(-1, 1, (2,), np.float32),
            np.array([[-1, 1], [1, -1], [0, 0.5]], dtype=np.float32),
            np.array([[-1, 1], [1.01, -1], [0, 0.5]], dtype=np.float32),
        ),
    ],
)
def test_good_pairs_at_the_edges_pass(space, acts, beyond):
    data = edge_dataset(acts)
    dataset_checks.check_dataset(data, OBS, space)  # a false alarm raises
    for i in range(len(data)):
        assert dataset_checks.pair_problems(data[i], OBS, space) == [], i
    # One step past an edge is caught, in every pair.
    with pytest.raises(ValueError, match=r"3 of 3 pairs .*\n  pair 0: fragment 1 has"):
        dataset_checks.check_dataset(edge_dataset(np.asarray(beyond)), OBS, space)


def test_empty_dataset_is_named():
    with pytest.raises(ValueError, match=r"^data\.pkl holds no preference pairs$"):
        check(pc.PreferenceDataset(), name="data.pkl")


def nan_fragment():
    bad = fragment()
    bad.obs[2, 1] = np.nan
    return bad


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (fragment(obs_dim=5), r"observations of shape \(5,\), the environment \(4,\)"),
        (nan_fragment(), r"non-finite observation \(step 2\)"),
        (fragment(acts=[0, 2, 1]), r"action outside .*Discrete\(2\) \(step 1: 2\)"),
        (fragment(acts=[0.0, 1.0, 1.0]), r"float64 actions for .* Discrete space"),
        (fragment(acts=[[0], [1], [1]]), r"actions of shape \(1,\), the environment"),
    ],
)
def test_a_later_bad_pair_is_named_by_index(bad, message):
    with pytest.raises(ValueError, match=r"1 of 6 pairs do not fit") as error:
        check(dataset(broken={4: bad}))
    listed = str(error.value).split("\n  ")[1:]
    assert len(listed) == 1 and listed[0].startswith("pair 4: fragment 1 ")
    assert re.search(message, listed[0])


def test_subset_errors_name_the_file_index():
    with pytest.raises(ValueError, match=r"\n  pair 17: fragment 1 has observations"):
        check(dataset(broken={1: fragment(obs_dim=3)}), indices=[3, 17, 20, 21, 22, 30])


def test_box_actions_out_of_bounds_and_many_bad_pairs_counted():
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    good = np.zeros((3, 2))
    far = good.copy()
    far[1, 0] = 1.5
    broken = {i: fragment(acts=far) for i in range(7)}
    data = pc.PreferenceDataset()
    data.push(
        [(broken.get(i, fragment(acts=good)), fragment(acts=good)) for i in range(8)],
        np.zeros(8, dtype=np.float32),
    )
    with pytest.raises(ValueError, match=r"7 of 8 pairs") as error:
        dataset_checks.check_dataset(data, OBS, box)
    text = str(error.value)
    assert text.count("outside the environment's action space") == 5
    assert text.endswith("... and 2 more")


def test_preference_out_of_range_is_named():
    data = dataset()
    data.preferences[2] = 1.5
    with pytest.raises(ValueError, match=r"pair 2: has preference 1\.5"):
        check(data)


# train() runs the checks before any step ------------------------------------------


def to_store(data):
    """The same pairs in this package's frame store."""
    store = PreferenceDataset()
    pairs = list(zip(data.fragments1, data.fragments2))
    store.push(pairs, np.asarray(data.preferences, dtype=np.float32))
    return store


def forced(frag, **fields):
    """``frag`` with ``fields`` replaced, bypassing the trajectory's own checks."""
    frag = copy.copy(frag)
    for name, value in fields.items():
        object.__setattr__(frag, name, value)
    return frag


def poisoned(rng, kind):
    """40 good pairs; pair 30's second fragment (or item) broken by ``kind``."""
    data = ref.make_dataset(rng, 40, (5,))
    frag = data.fragments2[30]
    if kind == "nan":
        frag.obs[3, 1] = np.nan
    elif kind == "inf":
        frag.obs[0, 0] = -np.inf
    elif kind == "counts":  # 7 observations for 10 actions
        data.fragments2[30] = forced(
            frag, obs=frag.obs[:1].repeat(7, 0), acts=np.zeros(10, np.int64)
        )
    elif kind == "range":
        frag.acts[2] = 3  # Discrete(3)
    elif kind == "float acts":
        data.fragments2[30] = forced(frag, acts=frag.acts.astype(np.float32))
    elif kind == "obs shape":
        data.fragments2[30] = forced(frag, obs=np.zeros((6, 5), np.float32))
    elif kind == "acts shape":
        data.fragments2[30] = forced(frag, acts=frag.acts[:, None])
    elif kind == "not a trajectory":
        data.fragments2[30] = "abc"
    return data


CASES = {
    "nan": r"fragment 2 has a non-finite observation \(step 3\)",
    "inf": r"fragment 2 has a non-finite observation \(step 0\)",
    "counts": r"fragment 2 has 7 observations for 10 actions",
    "range": r"fragment 2 has an action outside .*Discrete\(3\) \(step 2: 3\)",
    "float acts": r"fragment 2 has float32 actions for .*Discrete space",
    "obs shape": r"fragment 2 has observations of shape \(5,\), the environment \(4,\)",
    "acts shape": r"fragment 2 has actions of shape \(1,\), the environment \(\)",
    "not a trajectory": r"fragment 2 is not a trajectory with array obs and acts",
}


@pytest.mark.parametrize("kind", CASES)
def test_train_names_the_bad_pair_before_any_step(rng, kind):
    net = make_net()
    before = copy.deepcopy(net.state_dict())
    trainer = make_trainer(net, batch_size=4, forward_size=5)
    with pytest.raises(ValueError, match=r"1 of 40 pairs do not fit") as error:
        trainer.train(poisoned(rng, kind))
    assert re.search(r"\n  pair 30: " + CASES[kind], str(error.value))
    assert trainer.engine.n_steps == 0
    assert all(th.equal(before[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("kind", ["nan", "range"])
def test_train_on_a_store_or_its_subset_names_the_store_index(rng, kind):
    store = to_store(poisoned(rng, kind))
    trainer = make_trainer(make_net(), batch_size=4, forward_size=5)
    with pytest.raises(ValueError, match=r"\n  pair 30: " + CASES[kind]):
        trainer.train(store)
    subset = data_th.Subset(store, [2, 30, 5])
    with pytest.raises(ValueError, match=r"1 of 3 pairs .*\n  pair 30: fragment 2"):
        trainer.train(subset)
    trainer.train(data_th.Subset(store, [2, 5]))  # the good pairs train
    assert trainer.engine.n_steps == 1


def test_a_store_of_another_shape_or_kind_is_refused_whole(rng):
    data = ref.make_dataset(rng, 6, (3,))
    for side in (data.fragments1, data.fragments2):
        for i, frag in enumerate(side):
            side[i] = forced(frag, acts=frag.acts.astype(np.float32))
    trainer = make_trainer(make_net(), batch_size=4, forward_size=5)
    with pytest.raises(
        ValueError, match=r"(?s)6 of 6 pairs .*float32 actions"
    ) as error:
        trainer.train(to_store(data))
    assert str(error.value).endswith("... and 1 more")


def test_items_that_are_not_pairs_are_named(rng):
    good = ref.make_dataset(rng, 3, (3,))
    items = [good[0], ("just", "strings"), good[2]]
    trainer = make_trainer(make_net(), batch_size=4, forward_size=5)
    with pytest.raises(ValueError, match=r"\n  pair 1: is not \(\(fragment1"):
        trainer.train(items)


def test_evaluate_checks_too(rng):
    trainer = make_trainer(make_net(), batch_size=4, forward_size=5)
    with pytest.raises(ValueError, match=r"\n  pair 30: " + CASES["nan"]):
        trainer.evaluate(poisoned(rng, "nan"))


def test_float_observations_are_checked_a_block_at_a_time(rng, monkeypatch):
    monkeypatch.setattr(dataset_checks, "BLOCK_BYTES", 200)  # a few fragments each
    data = poisoned(rng, "nan")
    data.fragments1[3].obs[5, 2] = np.inf
    for dataset in (data, to_store(data)):
        problems = dataset_checks.dataset_problems(
            dataset, ref.OBS_SPACE, ref.ACT_SPACE
        )
        assert problems == {
            3: ["fragment 1 has a non-finite observation (step 5)"],
            30: ["fragment 2 has a non-finite observation (step 3)"],
        }


def test_train_checks_box_actions_finite_not_within_bounds(rng):
    obs, box = (
        gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        gym.spaces.Box(-1, 1, (2,)),
    )
    data = pc.PreferenceDataset()
    good = np.full((3, 2), 1.5, dtype=np.float32)  # beyond the bounds, finite
    data.push(
        [(fragment(acts=good.copy()), fragment(acts=good.copy())) for _ in range(4)],
        np.full(4, 0.5, dtype=np.float32),
    )
    net = BasicRewardNet(obs, box, hid_sizes=(8,))
    trainer = make_trainer(net, batch_size=4, forward_size=3)
    trainer.train(data)
    assert trainer.engine.n_steps == 1
    data.fragments1[2].acts[1, 0] = np.nan
    with pytest.raises(
        ValueError,
        match=r"1 of 4 pairs (?s:.*)\n  pair 2: fragment 1 has an action outside "
        r".* \(step 1: \[nan",
    ):
        trainer.train(data)
    assert trainer.engine.n_steps == 1
