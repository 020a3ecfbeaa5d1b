"""An Atari preference-comparison run on a tiny budget, stopped and resumed.

``imitation_accum/PongNoFrameskip-v4`` through the ``atari_pong`` named config:
the resumed run starts from every comparison, the reward net and its optimizer
state and the agent of the checkpoint it resumes, and goes on to the end, where
its store begins with those comparisons.
"""

import copy

import numpy as np
import torch as th
from stable_baselines3.common import save_util

from imitation_accum.io import run_checkpoint
from imitation_accum.preference import resumable

from . import test_resume_preference_comparisons as base
from . import test_resume_variants as variants

NAMED = ("atari_pong", "fast")
ATARI = {
    "environment": {"num_vec": 2},
    "reward_trainer_kwargs": {
        **base.CONFIG["reward_trainer_kwargs"],
        "minibatch_size": 2,
    },
}


def _arrays(store):
    names = ("frames", "acts", "fragments", "preferences")
    return {name: store._columns[name].to_array() for name in names}


def test_atari_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    log_dir = tmp_path / "run"
    variants._stop_after(log_dir, 2, monkeypatch, NAMED, **ATARI)
    checkpoint = run_checkpoint.complete(run_checkpoint.root(log_dir))[-1]
    saved = th.load(checkpoint / "state.pt", weights_only=True)["trainer"]
    _, saved_agent, _ = save_util.load_from_zip_file(checkpoint / "agent.zip")
    opened = resumable.open_preferences(checkpoint)
    assert opened is not None
    saved_pairs = _arrays(opened[0])
    assert len(saved_pairs["preferences"]) > 0

    seen = {}
    resume = resumable.ResumablePreferenceComparisons._resume

    def observed(self, *args, **kwargs):
        resume(self, *args, **kwargs)
        trainer = self.reward_trainer
        seen["net"] = {
            k: v.clone()
            for k, v in trainer._preference_model.model.state_dict().items()
        }
        seen["optimizer"] = copy.deepcopy(trainer.optim.state_dict())  # live tensors
        seen["agent"] = {
            k: v.clone() for k, v in self._agent().policy.state_dict().items()
        }
        seen["pairs"] = _arrays(self.dataset)

    monkeypatch.setattr(resumable.ResumablePreferenceComparisons, "_resume", observed)
    base.resume(log_dir, NAMED, **ATARI)

    # The resumed run began from the checkpoint: net, optimizer, agent, pairs.
    assert seen["net"].keys() == saved["net_state"].keys()
    for key, value in saved["net_state"].items():
        assert th.equal(seen["net"][key], value), key
    optimizer, saved_optimizer = seen["optimizer"], saved["optimizer_state"]
    assert optimizer["state"].keys() == saved_optimizer["state"].keys()
    assert optimizer["state"]  # AdamW has taken steps: its moments are held
    for index, moments in saved_optimizer["state"].items():
        for name, value in moments.items():
            assert th.equal(optimizer["state"][index][name], value), (index, name)
    for key, value in saved_agent["policy"].items():
        assert th.equal(seen["agent"][key], value), key
    for name, array in saved_pairs.items():
        assert np.array_equal(seen["pairs"][name], array), name

    # It went on to the end; its store begins with the checkpoint's comparisons.
    last = run_checkpoint.complete(run_checkpoint.root(log_dir))[-1]
    assert last.name == f"{base.ITERATIONS:06d}"
    final = resumable.open_preferences(last)
    assert final is not None
    final_pairs = _arrays(final[0])
    assert len(final_pairs["preferences"]) == base.CONFIG["total_comparisons"]
    held = len(saved_pairs["preferences"])
    assert np.array_equal(final_pairs["preferences"][:held], saved_pairs["preferences"])
    assert np.array_equal(
        final_pairs["frames"][: len(saved_pairs["frames"])], saved_pairs["frames"]
    )
