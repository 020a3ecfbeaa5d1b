"""Logged figures, batch order, determinism, ensembles and PreferenceComparisons."""

import copy
import resource

import numpy as np
import pytest
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import rollout
from imitation.rewards.reward_nets import (
    AddSTDRewardWrapper,
    BasicRewardNet,
    RewardEnsemble,
)
from imitation.util import logger as imit_logger
from imitation.util import networks

from imitation_accum import (
    CrossEntropyRewardTrainer,
    EnsembleTrainer,
    make_reward_trainer,
)
from imitation_accum.preference import trainer as preference_trainer
from tests import reference as ref
from tests.test_preference_exactness import make_net, make_trainer

LOGGED = ("loss", "accuracy", "gt_reward_loss", "grad_norm")


def final_values(trainer):
    values = trainer.logger.name_to_value
    return {k: values[f"reward/final/train/{k}"] for k in LOGGED}


def test_logged_figures_are_full_batch_and_equal_for_every_minibatch(rng):
    dataset = ref.make_dataset(rng, 10, (4, 6), binary=True)
    logged = {}
    for mb in (None, 4, 3, 1):
        th.manual_seed(0)
        net = make_net(normalize_input_layer=networks.RunningNorm)
        trainer = make_trainer(net, batch_size=4, minibatch_size=mb, forward_size=5)
        trainer.train(dataset)
        logged[mb] = final_values(trainer)
        assert trainer.logger.name_to_value["reward/final/train/chunks_per_step"] == (
            pytest.approx(np.mean([-(-n // (mb or 4)) for n in (4, 4, 2)]))
        )
    for mb in (4, 3, 1):
        for key in LOGGED:
            assert logged[mb][key] == pytest.approx(logged[None][key], rel=1e-5), key


def test_logged_loss_and_accuracy_match_reference(rng):
    dataset = ref.make_dataset(rng, 6, (5,), binary=True)
    net = make_net()
    initial = copy.deepcopy(net)
    trainer = make_trainer(net, batch_size=6, minibatch_size=4, forward_size=7)
    trainer.train(dataset)
    pairs, prefs = ref.batch_of(dataset, range(6))
    with th.no_grad():
        loss = ref.full_batch_loss(initial, pairs, prefs)
    raw = trainer.logger.name_to_value
    assert raw["reward/final/train/loss"] == pytest.approx(float(loss), rel=1e-5)
    # gt_reward_loss: the loss the fragments' true rewards would get
    gt = th.tensor(
        [[a.rews.sum(), b.rews.sum()] for a, b in pairs],
        dtype=th.float32,
    )
    gt_probs = 1 / (1 + th.exp(gt[:, 1] - gt[:, 0]))
    gt_loss = th.nn.functional.binary_cross_entropy(gt_probs, th.as_tensor(prefs))
    assert raw["reward/final/train/gt_reward_loss"] == pytest.approx(float(gt_loss))


def reference_accuracy(net, pairs, prefs) -> float:
    """Share of pairs whose preferred fragment gets the larger return (plainly)."""
    correct = 0
    with th.no_grad():
        for (a, b), pref in zip(pairs, prefs):
            ret_a, ret_b = (
                net(
                    *net.preprocess(
                        f.obs[:-1], f.acts, f.obs[1:], np.zeros(len(f.acts))
                    )
                ).sum()
                for f in (a, b)
            )
            prob_a = 1 / (1 + th.exp(ret_b - ret_a))
            correct += int(bool(prob_a > 0.5) == (pref > 0.5))
    return correct / len(pairs)


def test_logged_accuracy_matches_reference_and_mean_of_means_differs(rng):
    dataset = ref.make_dataset(rng, 12, (5,), binary=True)
    pairs, prefs = ref.batch_of(dataset, range(12))
    th.manual_seed(0)
    net = make_net()
    initial = copy.deepcopy(net)
    trainer = make_trainer(net, batch_size=12, minibatch_size=5, forward_size=7)
    trainer.train(dataset)
    raw = trainer.logger.name_to_value
    expected = reference_accuracy(initial, pairs, prefs)
    assert raw["reward/final/train/accuracy"] == pytest.approx(expected)
    with th.no_grad():
        expected_loss = float(ref.full_batch_loss(initial, pairs, prefs))
    assert raw["reward/final/train/loss"] == pytest.approx(expected_loss, rel=1e-5)
    # The naive figure, a mean of the minibatch means (5, 5, 2 pairs), is not it.
    with th.no_grad():
        naive_loss = np.mean(
            [
                float(ref.full_batch_loss(initial, pairs[i : i + 5], prefs[i : i + 5]))
                for i in range(0, 12, 5)
            ],
        )
    assert abs(naive_loss - expected_loss) > 1e-3


def test_steps_log_throughput_memory_and_chunking(rng, monkeypatch):
    dataset = ref.make_dataset(rng, 10, (4,))
    net = make_net()
    # lr=0 keeps the parameters: each step's gradient norm is then that of the
    # initial net on the step's batch, computed plainly below.
    trainer = make_trainer(
        net, seed=1, batch_size=4, minibatch_size=3, forward_size=5, lr=0.0
    )
    steps = []
    original = type(trainer)._train_step

    def recording(self, table, batch):
        result = original(self, table, batch)
        steps.append(result)
        return result

    monkeypatch.setattr(type(trainer), "_train_step", recording)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainer.train(dataset)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    raw = trainer.logger.name_to_value
    perm = ref.epoch_permutations(1, 10, 1)[0]
    norms = []
    for start in (0, 4, 8):
        pairs, prefs = ref.batch_of(dataset, perm[start : start + 4])
        grads = ref.grads_of(
            net, lambda p=pairs, q=prefs: ref.full_batch_loss(net, p, q)
        )
        norms.append(float(ref.flat(grads).norm()))
    assert [s.n_items for s in steps] == [4, 4, 2]
    throughput = np.mean([s.n_items / s.seconds for s in steps])
    # Batches of 4, 4 and 2 pairs of 4-transition fragments, in chunks of 3 pairs.
    for prefix in ("mean/reward/epoch-0/train/", "reward/final/train/"):
        assert raw[prefix + "grad_norm"] == pytest.approx(np.mean(norms), rel=1e-5)
        assert raw[prefix + "pairs_per_second"] == pytest.approx(throughput)
        # On a CPU: the process's peak resident memory, which only grows.
        peak = raw[prefix + "peak_memory_mib"] * 2**20
        assert rss_before <= peak <= rss_after
        assert raw[prefix + "forward_size"] == 5
        assert raw[prefix + "chunk_transitions"] == pytest.approx((24 + 24 + 16) / 3)
        assert raw[prefix + "chunks_per_step"] == pytest.approx((2 + 2 + 1) / 3)
        assert raw[prefix + "two_pass"] == 0


class RecordingBar:
    """Stands for tqdm: records the total, updates and postfixes."""

    bars: list = []

    def __init__(self, total, disable, **kwargs):
        self.total, self.disable, self.updates, self.postfixes = total, disable, 0, []
        RecordingBar.bars.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        self.updates += n

    def set_postfix(self, postfix, refresh=True):
        self.postfixes.append((dict(postfix), refresh))


def test_progress_bar_advances_once_per_step(rng, monkeypatch):
    monkeypatch.setattr(preference_trainer, "tqdm", RecordingBar)
    RecordingBar.bars = []
    dataset = ref.make_dataset(rng, 10, (4,))
    trainer = make_trainer(
        make_net(),
        batch_size=4,
        minibatch_size=3,
        epochs=2,
        progress_bar=True,
    )
    steps = []
    original = type(trainer)._train_step

    def recording(self, table, batch):
        steps.append(original(self, table, batch))
        return steps[-1]

    monkeypatch.setattr(type(trainer), "_train_step", recording)
    trainer.train(dataset)
    (bar,) = RecordingBar.bars
    assert not bar.disable
    assert bar.total == bar.updates == 2 * 3  # 2 epochs of batches 4, 4, 2
    assert {"loss", "acc", "pairs/s", "peak"} <= set(bar.postfixes[0][0])
    # The bar's last refresh shows the last step's figures.
    final, refreshed = bar.postfixes[-1]
    assert refreshed
    assert final["loss"] == f"{steps[-1].loss:.4f}"
    assert final["acc"] == f"{steps[-1].metrics['accuracy']:.3f}"


def recorded_batches(trainer, dataset):
    batches = []
    original = trainer._train_step

    def spy(table, batch):
        batches.append(tuple(batch))
        return original(table, batch)

    trainer._train_step = spy
    trainer.train(dataset)
    return batches


def test_batches_do_not_depend_on_minibatch_size_or_torch_rng(rng):
    dataset = ref.make_dataset(rng, 10, (3,))
    orders = []
    for mb, torch_seed in ((None, 0), (3, 1), (1, 2)):
        th.manual_seed(torch_seed)
        trainer = make_trainer(
            make_net(), seed=9, batch_size=4, minibatch_size=mb, epochs=3
        )
        orders.append(recorded_batches(trainer, dataset))
    assert orders[0] == orders[1] == orders[2]
    epochs = [orders[0][i : i + 3] for i in range(0, 9, 3)]
    for epoch in epochs:  # B1 B2 B3: every epoch covers the dataset once
        assert sorted(i for batch in epoch for i in batch) == list(range(10))
    assert epochs[0] != epochs[1] != epochs[2]  # B1' differs: fresh permutation


@pytest.mark.parametrize("minibatch_size", [None, 3])
def test_same_seed_gives_bit_identical_parameters(rng, minibatch_size):
    dataset = ref.make_dataset(rng, 11, (4, 2))
    finals = []
    for _ in range(2):
        th.manual_seed(0)
        net = make_net(dropout_prob=0.3, normalize_input_layer=networks.RunningNorm)
        trainer = make_trainer(
            net,
            seed=4,
            batch_size=4,
            minibatch_size=minibatch_size,
            epochs=2,
            forward_size=5,
        )
        trainer.train(dataset)
        finals.append([p.detach().clone() for p in net.parameters()])
        finals[-1] += [b.clone() for b in net.buffers()]
    assert all(th.equal(a, b) for a, b in zip(*finals))


def ensemble(n_members=3):
    members = [make_net() for _ in range(n_members)]
    return RewardEnsemble(ref.OBS_SPACE, ref.ACT_SPACE, members)


@pytest.mark.parametrize("wrap", [False, True])
def test_ensemble_members_get_the_full_batch_update(rng, wrap):
    dataset = ref.make_dataset(rng, 9, (3, 4), binary=True)
    finals = {}
    for mb in (None, 2):
        th.manual_seed(0)
        model = ensemble()
        net = AddSTDRewardWrapper(model) if wrap else model
        trainer = make_reward_trainer(
            pc.PreferenceModel(net),
            pc.CrossEntropyRewardLoss(),
            np.random.default_rng(2),
            {
                "batch_size": 4,
                "minibatch_size": mb,
                "forward_size": 5,
                "progress_bar": False,
                "optimizer_cls": th.optim.SGD,
                "lr": 0.1,
            },
        )
        assert isinstance(trainer, EnsembleTrainer)
        assert isinstance(trainer, pc.EnsembleTrainer)
        trainer.train(dataset)
        finals[mb] = [list(m.parameters()) for m in model.members]
        values = trainer.logger.name_to_value
        assert "reward/final/train/loss" in values  # averaged over members
        assert "reward/final/train/loss_std" in values
    for full, split in zip(finals[None], finals[2]):
        assert ref.relative_error(split, full) < 1e-6
    # bagging: members trained on different resamples end up different
    assert ref.relative_error(finals[None][0], finals[None][1]) > 1e-3


def test_plain_trainer_rejects_an_ensemble():
    with pytest.raises(TypeError, match="EnsembleTrainer"):
        make_trainer(ensemble())


def test_preference_comparisons_runs_with_this_trainer(rng):
    """Imitation's PreferenceComparisons asserts the final loss/accuracy keys."""
    venv_rng = np.random.default_rng(0)
    from imitation.util import util

    venv = util.make_vec_env("CartPole-v1", n_envs=1, rng=venv_rng)
    trajs = rollout.generate_trajectories(
        None,
        venv,
        rollout.make_sample_until(min_episodes=20),
        rng=venv_rng,
    )
    net = BasicRewardNet(venv.observation_space, venv.action_space)
    logger = imit_logger.configure(format_strs=[])
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(1),
        batch_size=8,
        minibatch_size=3,
        custom_logger=logger,
        progress_bar=False,
    )
    main = pc.PreferenceComparisons(
        pc.TrajectoryDataset(trajs, rng=np.random.default_rng(2)),
        net,
        num_iterations=2,
        fragmenter=pc.RandomFragmenter(
            rng=np.random.default_rng(3), warning_threshold=0
        ),
        preference_gatherer=pc.SyntheticGatherer(rng=np.random.default_rng(4)),
        reward_trainer=trainer,
        fragment_length=5,
        initial_epoch_multiplier=2,
        custom_logger=logger,
        allow_variable_horizon=True,
    )
    result = main.train(total_timesteps=10, total_comparisons=20)
    assert np.isfinite(result["reward_loss"])
    assert 0 <= result["reward_accuracy"] <= 1


def test_printed_output_is_a_line_per_train_and_one_table(rng, tmp_path, capsys):
    dataset = ref.make_dataset(rng, 8, (3,))
    logger = imit_logger.configure(str(tmp_path), ["stdout", "csv"])
    trainer = make_trainer(
        make_net(),
        batch_size=4,
        epochs=3,
        forward_size=4,
        progress_bar=True,
        custom_logger=logger,
    )
    trainer.train(dataset)
    logger.dump(0)
    printed = capsys.readouterr().out.splitlines()
    # One line per phase (an initial phase may have hundreds of epochs).
    lines = [line for line in printed if line.startswith("reward model")]
    assert [line.split(":")[0] for line in lines] == [
        "reward model, 3 epochs of 2 steps"
    ]
    rows = [line for line in printed if line.startswith("|")]
    assert not [row for row in rows if "epoch-" in row]
    assert any("final/train/loss" in row for row in rows)
    # The per-epoch figures still reach the files.
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    assert "mean/reward/epoch-2/train/loss" in header
