"""The accelerator options as config keys, and the GPU named configs."""

import json

import numpy as np
import pytest
from imitation.util import util

from imitation_accum.scripts import presets
from imitation_accum.scripts.train_adversarial import train_adversarial_ex
from imitation_accum.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex,
)
from imitation_accum.scripts.train_reward_model import train_reward_model_ex
from tests.scripts import helpers


def test_bad_option_named_before_anything_is_built(monkeypatch, tmp_path):
    def make_vec_env(*args, **kwargs):
        raise AssertionError("an environment was built before the config was checked")

    monkeypatch.setattr(util, "make_vec_env", make_vec_env)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ValueError, match=r"reward_trainer_kwargs\.acceleration\.pinned is not"
    ):
        train_preference_comparisons_ex.run(
            named_configs=["fast"],
            config_updates={"reward_trainer_kwargs": {"acceleration": {"pinned": 1}}},
        )
    with pytest.raises(
        TypeError, match=r"algorithm_kwargs\.acceleration\.compile must be"
    ):
        train_adversarial_ex.run(
            command_name="gail",
            named_configs=["fast"],
            config_updates={
                "algorithm_kwargs": {"acceleration": {"compile": "yes"}},
                "demonstrations": {"n_expert_demos": 1},
            },
        )


def test_options_are_config_keys(tmp_path):
    options = {"pinned_staging": True, "cudnn_benchmark": True}
    run = helpers.run(
        train_preference_comparisons_ex,
        tmp_path,
        ["fast"],
        {
            "reward_trainer_kwargs": {
                "batch_size": 4,
                "minibatch_size": 2,
                "progress_bar": False,
                "acceleration": options,
            },
        },
    )
    assert np.isfinite(run.result["reward_loss"])
    config = json.loads((helpers.log_dir(run) / "config.json").read_text())
    assert config["reward_trainer_kwargs"]["acceleration"] == options


def test_gpu_bf16_named_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = train_preference_comparisons_ex.run(
        command_name="print_config", named_configs=["gpu_bf16"]
    )
    assert run.config["reward_trainer_kwargs"]["autocast_dtype"] == "bfloat16"
    assert train_reward_model_ex.named_configs["gpu_bf16"] is not None
    assert presets.GPU_BF16["reward_trainer_kwargs"]["autocast_dtype"] == ("bfloat16")
