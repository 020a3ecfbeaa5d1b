"""Training on the frame store equals training on imitation's dataset, bit for bit."""

from typing import Dict

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards import reward_nets
from torch.utils import data as data_th

from imitation_accum import CrossEntropyRewardTrainer, PreferenceDataset
from imitation_accum.preference import dataset as store_dataset
from imitation_accum.preference import pair_table
from tests.test_frame_store import (
    FRAME,
    STACK,
    imitation_dataset,
    make_pairs,
    preferences_of,
)

OBS = gym.spaces.Box(0, 255, (*FRAME, STACK), np.uint8)
ACTS = gym.spaces.Discrete(3)


def train(dataset, *, discount: float = 1.0, minibatch_size=3) -> Dict[str, th.Tensor]:
    """Parameters after two epochs from one seed, with ``forward_size`` pinned."""
    th.manual_seed(0)
    net = reward_nets.CnnRewardNet(OBS, ACTS, hid_channels=(4,))
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net, discount_factor=discount),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(3),
        batch_size=4,
        minibatch_size=minibatch_size,
        epochs=2,
        forward_size=5,
        progress_bar=False,
    )
    trainer.train(dataset)
    return {name: p.detach().clone() for name, p in net.named_parameters()}


def assert_identical(a: Dict[str, th.Tensor], b: Dict[str, th.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert th.equal(a[name], b[name]), name


@pytest.fixture
def data(rng):
    pairs, prefs = make_pairs(rng, 9, length=6), preferences_of(rng, 9)
    return pairs, prefs


@pytest.mark.parametrize("discount", [1.0, 0.9])
def test_store_trains_bit_identically_to_imitations_dataset(data, tmp_path, discount):
    pairs, prefs = data
    expected = train(imitation_dataset(pairs, prefs), discount=discount)
    store = PreferenceDataset()
    store.push(pairs, prefs)
    assert_identical(train(store, discount=discount), expected)
    store.save(tmp_path / "store")
    mapped = PreferenceDataset.load(tmp_path / "store")
    assert_identical(train(mapped, discount=discount), expected)


@pytest.mark.parametrize("minibatch_size", [1, None])
def test_subsets_train_identically(data, minibatch_size):
    """A ``Subset`` of the store (what the held-out split and val_split make)."""
    pairs, prefs = data
    store = PreferenceDataset()
    store.push(pairs, prefs)
    keep = [0, 2, 3, 5, 6, 8]
    reference = imitation_dataset([pairs[i] for i in keep], prefs[keep])
    assert_identical(
        train(data_th.Subset(store, keep), minibatch_size=minibatch_size),
        train(reference, minibatch_size=minibatch_size),
    )


def test_a_store_read_in_the_wrong_stack_order_fails_the_same_test(data, monkeypatch):
    """The comparison above catches a store that stacks frames newest first."""
    pairs, prefs = data
    expected = train(imitation_dataset(pairs, prefs))
    store = PreferenceDataset()
    store.push(pairs, prefs)
    stack = store_dataset.StackLayout.stack
    monkeypatch.setattr(
        store_dataset.StackLayout,
        "stack",
        lambda self, frames: stack(self, frames[:, ::-1]),
    )
    trained = train(store)
    assert any(not th.equal(trained[name], expected[name]) for name in expected)


def test_chunks_gather_from_the_store_without_fragment_objects(data, monkeypatch):
    """The trainer's table reads observations by id; no fragment is materialized."""
    pairs, prefs = data
    store = PreferenceDataset()
    store.push(pairs, prefs)
    table = pair_table.read_preferences(store)
    assert isinstance(table, pair_table.StoredPreferenceTable)
    made = []
    real = PreferenceDataset._fragment
    monkeypatch.setattr(
        PreferenceDataset,
        "_fragment",
        lambda self, i: made.append(i) or real(self, i),
    )
    layout = table.side_layout(np.arange(9), 1)
    obs, acts, next_obs, dones = layout.gather(4, 17)
    assert made == []
    expected = np.concatenate(
        [pairs[0][1].obs[4:6], pairs[1][1].obs[:6], pairs[2][1].obs[:5]]
    )
    np.testing.assert_array_equal(obs, expected)
    assert obs.flags.c_contiguous and obs.dtype == np.uint8
    np.testing.assert_array_equal(next_obs[:2], pairs[0][1].obs[5:7])
    np.testing.assert_array_equal(acts[:2], pairs[0][1].acts[4:6])
    assert dones[1]  # second fragments are terminal in make_pairs
    train(store)
    assert made == []  # training materializes no fragment either
