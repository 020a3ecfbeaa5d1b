"""Atomic writes, training states, and reward nets in imitation's format."""

import copy
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.rewards import reward_nets
from imitation.util import networks

from imitation_accum import CrossEntropyRewardTrainer, checkpoint
from imitation_accum.io import atomic
from imitation_accum.nets.shaped import CnnShapedRewardNet
from tests import reference as ref


def make_net(hid_sizes=(16, 16)) -> reward_nets.RewardNet:
    base = reward_nets.BasicRewardNet(
        ref.OBS_SPACE,
        ref.ACT_SPACE,
        hid_sizes=hid_sizes,
        normalize_input_layer=networks.RunningNorm,
    )
    return reward_nets.NormalizedRewardNet(base, networks.RunningNorm)


def make_trainer(net, seed=0, **kwargs) -> CrossEntropyRewardTrainer:
    kwargs.setdefault("progress_bar", False)
    return CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(seed),
        batch_size=4,
        minibatch_size=3,
        forward_size=4,
        **kwargs,
    )


def outputs(net, rng) -> th.Tensor:
    obs = rng.normal(size=(6, 4)).astype(np.float32)
    acts = rng.integers(0, 3, size=6)
    with th.no_grad():
        return net(*net.preprocess(obs, acts, obs, np.zeros(6, bool)))


# --- atomic writes ----------------------------------------------------------


def test_atomic_save_replaces_the_file(tmp_path):
    path = tmp_path / "deep" / "state.pt"
    checkpoint.atomic_save({"a": th.ones(3)}, path)
    checkpoint.atomic_save({"a": th.zeros(3)}, path)
    assert th.equal(th.load(path)["a"], th.zeros(3))
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.pt"]


def test_failed_write_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    checkpoint.atomic_save({"epoch": 1}, path)

    def half_write(obj, file):
        file.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(atomic.th, "save", half_write)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.atomic_save({"epoch": 2}, path)
    monkeypatch.undo()
    assert th.load(path) == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_write_killed_midway_leaves_the_old_file(tmp_path):
    """A process killed inside the write: the target is intact, the rest is swept."""
    path = tmp_path / "state.pt"
    checkpoint.atomic_save({"epoch": 1}, path)
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from imitation_accum import checkpoint
        from imitation_accum.io import atomic
        def killed_midway(obj, file):
            file.write(b"PK partial")
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        atomic.th.save = killed_midway
        checkpoint.atomic_save({{"epoch": 2}}, {str(path)!r})
        """,
    )
    done = subprocess.run([sys.executable, "-c", script], check=False)
    assert done.returncode == -9
    assert th.load(path) == {"epoch": 1}
    leftovers = [p for p in tmp_path.iterdir() if p.name != "state.pt"]
    assert len(leftovers) == 1 and leftovers[0].name.endswith(".partial")
    assert checkpoint.remove_stale_temporaries(path) == leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


# --- reward nets ------------------------------------------------------------


def test_reward_net_round_trip(tmp_path, rng):
    net = make_net()
    with th.no_grad():
        net.base.mlp.normalize_input.running_mean.fill_(0.3)
    path = checkpoint.save_reward_net(net, tmp_path / "final" / "reward_net.pt")
    loaded = checkpoint.load_reward_net(path)
    assert type(loaded) is type(net) and not loaded.training
    assert th.equal(outputs(net.eval(), rng), outputs(loaded, np.random.default_rng(0)))


def test_reward_net_is_saved_without_its_ddp_wrapper(tmp_path):
    class Wrapper(th.nn.Module):  # stands for DistributedDataParallel
        def __init__(self, module):
            super().__init__()
            self.module = module

    net = make_net()
    path = checkpoint.save_reward_net(Wrapper(net), tmp_path / "reward_net.pt")
    assert type(checkpoint.load_reward_net(path)) is reward_nets.NormalizedRewardNet


class HomemadeRewardNet(reward_nets.BasicRewardNet):
    """A class torch's safe loading does not know until registered."""


def test_unregistered_class_is_named_then_registration_loads_it(tmp_path):
    net = HomemadeRewardNet(ref.OBS_SPACE, ref.ACT_SPACE)
    with pytest.warns(UserWarning, match="HomemadeRewardNet"):
        path = checkpoint.save_reward_net(net, tmp_path / "reward_net.pt")
    with pytest.raises(ValueError, match=r"reward_net\.pt.*HomemadeRewardNet"):
        checkpoint.load_reward_net(path)
    checkpoint.register_safe_classes(HomemadeRewardNet)
    assert type(checkpoint.load_reward_net(path)) is HomemadeRewardNet


def test_load_reward_net_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.pt' does not exist"):
        checkpoint.load_reward_net(tmp_path / "missing.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(os.urandom(256))
    with pytest.raises(ValueError, match=r"corrupt\.pt"):
        checkpoint.load_reward_net(corrupt)
    not_a_net = tmp_path / "tensor.pt"
    th.save(th.ones(2), not_a_net)
    with pytest.raises(TypeError, match=r"tensor\.pt' holds a Tensor"):
        checkpoint.load_reward_net(not_a_net)


_IMITATION_LOADS = """
import sys
import numpy as np
{prelude}
from imitation.rewards import serialize
reward_fn = serialize.load_reward({kind!r}, {path!r}, None)
obs = np.zeros((3, 4), np.float32)
print(reward_fn(obs, np.zeros(3, int), obs, np.zeros(3, bool)).shape)
"""


def imitation_load(path, kind: str, prelude: str) -> subprocess.CompletedProcess:
    """Runs imitation's loader in a fresh process (registrations are per process)."""
    code = _IMITATION_LOADS.format(prelude=prelude, kind=kind, path=str(path))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
    )


FRAMES = gym.spaces.Box(0, 255, (12, 12, 4), np.uint8)
ACTIONS = gym.spaces.Discrete(3)


def make_cnn(kind: str) -> reward_nets.RewardNet:
    th.manual_seed(0)
    if kind == "cnn":
        return reward_nets.CnnRewardNet(FRAMES, ACTIONS, hid_channels=(4,))
    return CnnShapedRewardNet(
        FRAMES,
        ACTIONS,
        reward_hid_channels=(4,),
        potential_hid_channels=(4,),
    )


def frame_outputs(net) -> th.Tensor:
    obs = np.random.default_rng(0).integers(0, 256, (5, *FRAMES.shape), np.uint8)
    acts = np.arange(5) % 3
    with th.no_grad():
        return net(*net.preprocess(obs, acts, obs[::-1].copy(), np.zeros(5, bool)))


@pytest.mark.parametrize("kind", ["cnn", "cnn_shaped"])
def test_atari_reward_nets_round_trip(tmp_path, kind):
    """The nets of the Atari configs (GAIL/preferences: CNN; AIRL: shaped CNN)."""
    net = make_cnn(kind)
    path = checkpoint.save_reward_net(net, tmp_path / "reward_net.pt")
    loaded = checkpoint.load_reward_net(path)
    assert type(loaded) is type(net)
    assert th.equal(frame_outputs(net.eval()), frame_outputs(loaded))


_IMITATION_LOADS_FRAMES = """
import numpy as np
import imitation_accum
from imitation.rewards import serialize
imitation_accum.patch()
reward_fn = serialize.load_reward("RewardNet_unshaped", {path!r}, None)
obs = np.zeros((3, 12, 12, 4), np.uint8)
print(reward_fn(obs, np.zeros(3, int), obs, np.zeros(3, bool)).shape)
"""


def test_imitation_loader_reads_a_shaped_cnn(tmp_path):
    path = checkpoint.save_reward_net(make_cnn("cnn_shaped"), tmp_path / "r.pt")
    done = subprocess.run(
        [sys.executable, "-c", _IMITATION_LOADS_FRAMES.format(path=str(path))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(3,)"


@pytest.mark.parametrize("kind", ["RewardNet_normalized", "RewardNet_unnormalized"])
def test_imitation_loader_reads_saved_nets(tmp_path, kind):
    path = checkpoint.save_reward_net(make_net(), tmp_path / "reward_net.pt")
    done = imitation_load(path, kind, "import imitation_accum\nimitation_accum.patch()")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(3,)"


@pytest.mark.skipif(
    tuple(int(x) for x in th.__version__.split(".")[:2]) < (2, 6),
    reason="torch < 2.6 loads without weights_only by default",
)
@pytest.mark.parametrize("prelude", ["", "import imitation_accum"])
def test_imitation_loader_fails_unpatched(tmp_path, prelude):
    """What patching fixes: imitation 1.0.1 on torch >= 2.6, unpatched.

    ``import imitation_accum`` alone changes nothing in torch.
    """
    path = checkpoint.save_reward_net(make_net(), tmp_path / "reward_net.pt")
    done = imitation_load(path, "RewardNet_normalized", prelude)
    assert done.returncode != 0
    assert "Weights only load failed" in done.stderr


# --- training states --------------------------------------------------------


def test_resumed_training_equals_uninterrupted(tmp_path):
    dataset = ref.make_dataset(np.random.default_rng(5), 10, (3, 4))
    th.manual_seed(0)
    net = make_net()
    fresh = copy.deepcopy(net)
    trainer = make_trainer(net, lr=0.01)
    trainer.train(dataset)
    path = tmp_path / "training_state.pt"
    checkpoint.save_training_state(
        checkpoint.capture_state(trainer, epoch=1, metadata={"pairs": 10}),
        path,
    )
    trainer.train(dataset)  # the uninterrupted second epoch

    state = checkpoint.load_training_state(path)
    assert state.epoch == 1 and state.metadata == {"pairs": 10}
    resumed = make_trainer(fresh, seed=123, lr=0.01)  # other rng: restored below
    checkpoint.restore_state(resumed, state, path)
    resumed.train(dataset)
    for a, b in zip(net.state_dict().values(), fresh.state_dict().values()):
        assert th.equal(a, b)
    # Without the optimizer and generator states the second epoch differs.
    plain = make_net()
    plain.load_state_dict(state.net_state)
    make_trainer(plain, seed=123, lr=0.01).train(dataset)
    assert not all(
        th.equal(a, b)
        for a, b in zip(net.state_dict().values(), plain.state_dict().values())
    )


def test_state_from_another_architecture_is_named(tmp_path):
    path = tmp_path / "training_state.pt"
    small = make_trainer(make_net(hid_sizes=(8,)))
    checkpoint.save_training_state(checkpoint.capture_state(small, epoch=1), path)
    state = checkpoint.load_training_state(path)
    with pytest.raises(ValueError, match=r"training_state\.pt.*'_base\.mlp\.dense0"):
        checkpoint.check_fits(state, make_net(hid_sizes=(16,)), path)
    with pytest.raises(ValueError, match=r"lacks key '_base\.mlp\.dense1\.bias'"):
        checkpoint.check_fits(state, make_net(hid_sizes=(8, 8)), path)
    plain = reward_nets.BasicRewardNet(ref.OBS_SPACE, ref.ACT_SPACE, hid_sizes=(8,))
    with pytest.raises(ValueError, match=r"holds a .*NormalizedRewardNet"):
        checkpoint.check_fits(state, plain, path)


def test_state_for_another_optimizer_is_named(tmp_path):
    path = tmp_path / "training_state.pt"
    trainer = make_trainer(make_net())
    checkpoint.save_training_state(checkpoint.capture_state(trainer, epoch=1), path)
    sgd = make_trainer(make_net(), optimizer_cls=th.optim.SGD)
    with pytest.raises(ValueError, match=r"AdamW state.*SGD"):
        checkpoint.restore_state(sgd, checkpoint.load_training_state(path), path)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_load_training_state_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"nothing\.pt' does not exist"):
        checkpoint.load_training_state(tmp_path / "nothing.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x80\x04 not a checkpoint")
    with pytest.raises(ValueError, match=r"cannot read checkpoint .*corrupt\.pt"):
        checkpoint.load_training_state(corrupt)
    net_file = checkpoint.save_reward_net(make_net(), tmp_path / "reward_net.pt")
    with pytest.raises(ValueError, match="not a training state"):
        checkpoint.load_training_state(net_file)
