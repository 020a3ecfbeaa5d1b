"""Shared fixtures."""

import numpy as np
import pytest
import torch as th


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(seed=0)


@pytest.fixture(autouse=True)
def _torch_seed() -> None:
    th.manual_seed(0)
