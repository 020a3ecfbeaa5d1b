"""Trains a reward net offline from a saved preference dataset, on one process or many.

imitation saves the preferences a run gathered (``train_preference_comparisons with
save_preferences=True`` writes ``preferences.pkl``) but has nothing that trains
from them. This experiment does, with imitation's reward and logging ingredients::

    python -m imitation_accum.scripts.train_reward_model with
        dataset_path=output/.../preferences.pkl reward_trainer_kwargs.minibatch_size=8

(one command line) and on several processes (GPUs, or CPU cores with gloo), with
the same result::

    torchrun --nproc_per_node=4 -m imitation_accum.scripts.train_reward_model with
        dataset_path=output/.../preferences.pkl

A seeded share of the pairs is held out; the loss and accuracy on it are logged
after every epoch. The training state (reward net, optimizer, generators, epoch) is
checkpointed atomically to ``{log_dir}/checkpoints/training_state.pt`` and a run
continues from one with ``resume_from=...``; the final reward net is saved as
imitation saves it, ``{log_dir}/checkpoints/final/reward_net.pt``, ready for
``imitation.rewards.serialize.load_reward("RewardNet_normalized", ...)`` (under
``imitation_accum.patched()``) or :func:`imitation_accum.checkpoint.load_reward_net`.
Under ``torchrun`` only rank 0 logs and writes files. As a script, it seeds
torch's global generator with the run's seed (the library itself never does).

The dataset is a frame store (a directory written by
:meth:`imitation_accum.PreferenceDataset.save`, memory-mapped: processes on one
machine share one copy) or imitation's pickle; a pickle runs any code it holds when
loaded, so it is read only with ``trust_pickle=True``. ``python -m
imitation_accum.scripts.convert_preferences IN.pkl OUT`` converts one to a store.
"""

import contextlib
import logging
import os
import pathlib
import signal
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers, updaters
from imitation.rewards import reward_nets
from imitation.scripts.ingredients import environment, reward
from imitation.scripts.ingredients import logging as logging_ingredient
from imitation.util import logger as imit_logger

from imitation_accum import _validation, checkpoint, distributed
from imitation_accum.scripts import (
    atari_configs,
    config_checks,
    experiment,
    offline_data,
)

# Configured and run under imitation_accum.patched(), as this package's other
# experiments: imitation's reward ingredient then also builds CNN reward nets.
train_reward_model_ex = experiment.PatchedExperiment(
    "train_reward_model",
    ingredients=[
        logging_ingredient.logging_ingredient,
        environment.environment_ingredient,
        reward.reward_ingredient,
    ],
)
train_reward_model_ex.own_sections.extend(
    ["reward_trainer_kwargs", "preference_model_kwargs", "regularizer"]
)
train_reward_model_ex.add_alternatives(
    "reward_trainer_kwargs", "minibatch_size", "memory_budget"
)

#: Trainer arguments this experiment sets itself.
_SET_BY_EXPERIMENT = (
    "preference_model",
    "loss",
    "rng",
    "custom_logger",
    "regularizer_factory",
    "process_group",
)


@train_reward_model_ex.config
def train_defaults():
    """Defaults: imitation's reward trainer defaults, a tenth held out."""
    dataset_path = None  # a frame store, or a pickle saved by imitation's dataset
    trust_pickle = False  # load a pickle at dataset_path (runs any code it holds)
    held_out_fraction = 0.1  # share of the pairs held out, evaluated every epoch
    held_out_seed = 0  # seed of the held-out split (independent of the run's seed)
    preference_model_kwargs = {}  # noise_prob, discount_factor, threshold
    # Arguments of imitation_accum's CrossEntropyRewardTrainer.
    reward_trainer_kwargs = dict(
        batch_size=32,  # pairs per optimizer step, over all processes
        minibatch_size=None,  # pairs per forward/backward (None: a whole share)
        memory_budget=None,  # or size chunks to fit this ("6GiB", bytes, "auto")
        epochs=3,  # passes over the training pairs
        lr=1e-3,  # learning rate
        forward_size="auto",  # transitions per reward-net call, or "auto"
        drop_last=False,  # drop each epoch's partial last batch
        max_grad_norm=None,  # clip the gradient norm once per step
        optimizer_cls="AdamW",  # a torch.optim class, or its name
        optimizer_kwargs=None,  # further optimizer arguments (a dict)
        progress_bar=True,  # tqdm bar over steps (rank 0 only)
    )
    # imitation's regularizers, applied once per optimizer step.
    regularizer = dict(
        kind=None,  # None, "lp" (LpRegularizer) or "weight_decay"
        initial_lambda=1e-3,  # regularization strength
        p=2,  # exponent of "lp"
        scaling_factor=None,  # adapt lambda (IntervalParamScaler); None: fixed
        tolerable_interval=(0.9, 1.1),  # val/train loss ratio leaving lambda as is
        val_split=0.1,  # share of training pairs the lambda updater validates on
    )
    device = "auto"  # "auto": this process's GPU if there is one, else the CPU
    checkpoint_interval = 1  # epochs between checkpoints (0: at the end; <0: never)
    # torchrun: seconds to wait for the other ranks, then fail naming the missing
    collective_timeout_s = distributed.DEFAULT_COLLECTIVE_TIMEOUT_S
    resume_from = None  # a checkpoints/training_state.pt to continue from
    locals()  # quieten flake8


@train_reward_model_ex.named_config
def fast():
    """Tiny settings for smoke tests."""
    reward_trainer_kwargs = dict(batch_size=4, epochs=2, forward_size=16)
    reward_trainer_kwargs["progress_bar"] = False
    held_out_fraction = 0.25
    locals()  # quieten flake8


for _name, _game in atari_configs.GAMES.items():
    # The preprocessed, score-masked Atari environment and CnnRewardNet of the
    # preference-comparisons experiment's named config of the same name.
    train_reward_model_ex.add_named_config(
        _name,
        {
            "environment": atari_configs.environment(_game)["environment"],
            "reward": atari_configs.reward(),
        },
    )
train_reward_model_ex.add_named_config("gpu_bf16", atari_configs.GPU_BF16)


@train_reward_model_ex.config_hook
def _check_config(
    config: Dict[str, Any],
    command_name: str,
    logger: Any,
) -> Dict[str, Any]:
    """Config hook: every key checked before anything is loaded or built.

    A wrong value is named by its key (``reward_trainer_kwargs.minibatch_size``,
    ``held_out_fraction``, ...). The files (``dataset_path``, ``resume_from``)
    are needed only to train: ``print_config`` and the other commands run
    without them.
    """
    trains = command_name == "train_reward_model"
    path = config["dataset_path"]
    if path is None and trains:
        raise ValueError(
            "dataset_path is required: a PreferenceDataset saved with "
            "PreferenceDataset.save (train_preference_comparisons with "
            "save_preferences=True writes preferences.pkl)",
        )
    if path is not None and not pathlib.Path(path).exists():
        raise ValueError(f"dataset_path={path!r}: no such file")
    fraction = config["held_out_fraction"]
    if not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"held_out_fraction={fraction!r} must lie in [0, 1)")
    config_checks.check_reward_trainer_kwargs(
        config["reward_trainer_kwargs"],
        distributed.DistributedRewardTrainer,
        _SET_BY_EXPERIMENT,
        logger,
        optimizer_by_name=True,
    )
    config_checks.check_preference_model_kwargs(config["preference_model_kwargs"])
    _validation.non_negative_int("held_out_seed", config["held_out_seed"])
    interval = config["checkpoint_interval"]
    if isinstance(interval, bool) or not isinstance(interval, int):
        raise ValueError(f"checkpoint_interval={interval!r} must be an int")
    resume = config["resume_from"]
    if resume is not None and not pathlib.Path(resume).is_file():
        raise ValueError(f"resume_from={resume!r}: no such file")
    config_checks.check_regularizer(config["regularizer"])
    config_checks.check_reward_ingredient(config, "train_reward_model")
    config_checks.check_device(config["device"])
    distributed.process_group.check_timeout(
        "collective_timeout_s", config["collective_timeout_s"]
    )
    return {}


train_reward_model_ex.config_hook(config_checks.check_environment)


def _regularizer_factory(
    config: Mapping[str, Any],
) -> Optional[regularizers.RegularizerFactory]:
    """The imitation regularizer factory of the ``regularizer`` config, if any.

    The keys are checked by :func:`config_checks.check_regularizer`.
    """
    if config["kind"] is None:
        return None
    updater = None
    val_split = None
    if config["scaling_factor"] is not None:
        updater = updaters.IntervalParamScaler(
            config["scaling_factor"], tuple(config["tolerable_interval"])
        )
        val_split = float(config["val_split"])
    if config["kind"] == "lp":
        return regularizers.LpRegularizer.create(
            config["initial_lambda"],
            updater,
            val_split,  # type: ignore[arg-type]
            p=config["p"],
        )
    return regularizers.WeightDecayRegularizer.create(
        config["initial_lambda"],
        updater,
        val_split,  # type: ignore[arg-type]
    )


def _check_single_net(net: reward_nets.RewardNet) -> None:
    if any(isinstance(m, reward_nets.RewardEnsemble) for m in net.modules()):
        raise ValueError(
            "reward.net_cls: train_reward_model trains a single reward net, not a "
            "RewardEnsemble; train each member as its own run",
        )


def _check_resumable(
    state: checkpoint.TrainingState,
    metadata: Mapping[str, Any],
    path: str,
) -> None:
    """Raises unless ``state`` was written for this run's data and split.

    A checkpoint resumes only on the data and held-out split it was trained on.

    Args:
        state: The checkpoint's training state.
        metadata: This run's ``dataset_fingerprint``, ``dataset_path``,
            ``dataset_pairs`` and ``held_out_split``.
        path: ``resume_from`` (for messages).

    Raises:
        ValueError: naming ``resume_from`` and the key that differs.
    """
    saved = state.metadata
    old = saved.get("dataset_fingerprint")
    new = metadata["dataset_fingerprint"]
    if old is not None and old != new:
        raise ValueError(
            f"resume_from={path!r} was trained on the data of "
            f"{saved.get('dataset_path', 'another file')!r} (fingerprint "
            f"{old[:19]}), but dataset_path={metadata['dataset_path']!r} holds "
            f"other data (fingerprint {new[:19]}): resume with the dataset the "
            "checkpoint was trained on",
        )
    for key, value in metadata.items():
        if key in ("dataset_fingerprint", "dataset_path"):  # above; a file may move
            continue
        if saved.get(key) != value:
            raise ValueError(
                f"resume_from={path!r} was written for {key}="
                f"{saved.get(key)!r}, but this run has {value!r}: resume "
                "with the same dataset_path, held_out_fraction and held_out_seed",
            )


def _apply_configured_optimizer(
    trainer: Any,
    trainer_kwargs: Mapping[str, Any],
    custom_logger: imit_logger.HierarchicalLogger,
) -> None:
    """The configured lr and optimizer_kwargs win over a checkpoint's, and say so."""
    configured = {
        "lr": trainer_kwargs.get("lr", 1e-3),
        **(trainer_kwargs.get("optimizer_kwargs") or {}),
    }
    changed = checkpoint.apply_hyperparameters(trainer.optim, configured)
    for name, (old, new) in changed.items():
        key = "lr" if name == "lr" else f"optimizer_kwargs.{name}"
        custom_logger.log(
            f"Resuming with reward_trainer_kwargs.{key}={new!r}, not the "
            f"checkpoint's {old!r}: the configured value is applied",
        )


@contextlib.contextmanager
def _run_logger(
    context: distributed.DistributedContext,
) -> Iterator[Tuple[imit_logger.HierarchicalLogger, Optional[pathlib.Path]]]:
    """The run's imitation logger on rank 0; one that keeps nothing on the others."""
    if context.is_main:
        custom_logger, log_dir = logging_ingredient.setup_logging()
        yield custom_logger, log_dir
        return
    with tempfile.TemporaryDirectory(prefix="train_reward_model-") as scratch:
        yield imit_logger.configure(folder=scratch, format_strs=[]), None


def _agreed_seed(context: distributed.DistributedContext, seed: int) -> int:
    """Rank 0's seed on every rank (sacred draws one per process if none is set)."""
    if not context.distributed:
        return seed
    value = th.tensor([seed], dtype=th.int64)
    if context.backend == "nccl":
        value = value.to(context.device)
    th.distributed.broadcast(value, 0)
    return int(value.item())


@train_reward_model_ex.main
def train_reward_model(
    dataset_path: str,
    trust_pickle: bool,
    held_out_fraction: float,
    held_out_seed: int,
    preference_model_kwargs: Mapping[str, Any],
    reward_trainer_kwargs: Mapping[str, Any],
    regularizer: Mapping[str, Any],
    device: str,
    checkpoint_interval: int,
    resume_from: Optional[str],
    collective_timeout_s: float,
    environment: Mapping[str, Any],
    _seed: int,
) -> Mapping[str, Any]:
    """Trains a reward net on the preferences in ``dataset_path``.

    Args:
        dataset_path: A frame store, or a pickle of imitation's dataset.
        trust_pickle: Whether a pickle at ``dataset_path`` may be loaded.
        held_out_fraction: Share of the pairs held out and evaluated every epoch.
        held_out_seed: Seed of the held-out split.
        preference_model_kwargs: Arguments of imitation's ``PreferenceModel``.
        reward_trainer_kwargs: Arguments of ``CrossEntropyRewardTrainer``.
        regularizer: imitation regularizer settings (``kind`` None: none).
        device: Where to train (``"auto"``: this process's GPU if any).
        checkpoint_interval: Epochs between checkpoints (0: at the end; <0: never).
        resume_from: A training state to continue from.
        collective_timeout_s: How long a collective waits for the other ranks.
        environment: The environment ingredient's config (for the spaces).
        _seed: The run's seed (sacred).

    Returns:
        Held-out figures per epoch and the paths of the saved files (rank 0).
    """
    with contextlib.ExitStack() as stack:
        context = stack.enter_context(
            distributed.distributed_session(device, timeout_s=collective_timeout_s)
        )
        kwargs = dict(reward_trainer_kwargs)
        epochs = int(kwargs.pop("epochs", 1))
        kwargs["optimizer_cls"] = config_checks.optimizer_class(
            kwargs.get("optimizer_cls", "AdamW")
        )
        batch_size = int(kwargs.get("batch_size", 32))
        distributed.check_batch_size(
            "reward_trainer_kwargs.batch_size", batch_size, context.world_size
        )
        seed = _agreed_seed(context, _seed)
        # A script's choice, as imitation's scripts make it: torch's global
        # generator (the reward net's initial weights) is seeded from the run's seed.
        th.manual_seed(seed)

        dataset = offline_data.load_preference_dataset(dataset_path, trust_pickle)
        spaces = offline_data.environment_spaces(environment)
        offline_data.check_dataset(dataset, spaces, dataset_path, environment["gym_id"])
        data_fingerprint = offline_data.same_data_on_every_rank(
            context, dataset, dataset_path
        )
        train_idx, held_out_idx = offline_data.split_held_out(
            len(dataset), held_out_fraction, held_out_seed
        )
        if len(train_idx) < batch_size:
            raise ValueError(
                f"dataset_path={dataset_path!r} has {len(dataset)} pairs; after "
                f"holding out {len(held_out_idx)} (held_out_fraction="
                f"{held_out_fraction}), {len(train_idx)} remain for training, fewer "
                f"than one batch (reward_trainer_kwargs.batch_size={batch_size})",
            )
        metadata = {
            "dataset_pairs": len(dataset),
            "held_out_split": offline_data.split_digest(held_out_idx),
            "dataset_fingerprint": data_fingerprint,
            "dataset_path": str(dataset_path),
        }

        net = reward.make_reward_net(spaces)
        _check_single_net(net)
        state = None
        if resume_from is not None:
            state = checkpoint.load_training_state(resume_from)
            checkpoint.check_fits(state, net, resume_from)
            _check_resumable(state, metadata, resume_from)
        net = net.to(context.device)

        custom_logger, log_dir = stack.enter_context(_run_logger(context))
        trainer = distributed.DistributedRewardTrainer(
            pc.PreferenceModel(net, **preference_model_kwargs),
            pc.CrossEntropyRewardLoss(),
            np.random.default_rng(seed),
            epochs=1,  # one epoch per train() call, to checkpoint between epochs
            custom_logger=custom_logger,
            regularizer_factory=_regularizer_factory(regularizer),
            **kwargs,
        )
        first_epoch = 0
        if state is not None:
            assert resume_from is not None
            checkpoint.restore_state(trainer, state, resume_from)
            first_epoch = state.epoch
            custom_logger.log(f"Resuming from {resume_from} after epoch {first_epoch}")
            _apply_configured_optimizer(trainer, reward_trainer_kwargs, custom_logger)

        checkpoint_dir = None if log_dir is None else log_dir / "checkpoints"
        state_path = None
        if checkpoint_dir is not None and checkpoint_interval >= 0:
            state_path = checkpoint_dir / checkpoint.TRAINING_STATE_NAME
            checkpoint.remove_stale_temporaries(state_path)

        def save_state(epoch: int) -> None:
            if state_path is not None:
                captured = checkpoint.capture_state(
                    trainer, epoch=epoch, metadata=metadata
                )
                checkpoint.save_training_state(captured, state_path)

        train_set = offline_data.subset(dataset, train_idx)
        held_out_set = offline_data.subset(dataset, held_out_idx)
        history: List[Dict[str, float]] = []
        for epoch in range(first_epoch, epochs):
            trainer.train(train_set)
            figures: Dict[str, float] = {"epoch": epoch + 1}
            if len(held_out_idx):
                result = trainer.evaluate(held_out_set)
                figures["loss"] = result.loss
                figures["accuracy"] = result.metrics["accuracy"]
                custom_logger.record("held_out/loss", result.loss)
                custom_logger.record("held_out/accuracy", result.metrics["accuracy"])
            custom_logger.record("epoch", epoch + 1)
            custom_logger.dump(epoch + 1)
            history.append(figures)
            last = epoch + 1 == epochs
            periodic = (
                checkpoint_interval > 0 and (epoch + 1) % checkpoint_interval == 0
            )
            if periodic or last:
                save_state(epoch + 1)

        results: Dict[str, Any] = {"epochs": epochs, "held_out": history}
        if checkpoint_dir is not None:
            final = checkpoint_dir / "final" / "reward_net.pt"
            results["reward_net"] = str(checkpoint.save_reward_net(net, final))
            if state_path is not None:
                if first_epoch >= epochs:  # nothing trained: still leave a state
                    save_state(first_epoch)
                results["training_state"] = str(state_path)
        return results


def main_console() -> None:
    """Command-line entry point; under ``torchrun`` only rank 0 observes the run."""
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        quiet = logging.getLogger(f"train_reward_model.rank{rank}")
        quiet.setLevel(logging.WARNING)
        train_reward_model_ex.logger = quiet  # type: ignore[assignment]
    # torchrun stops the other ranks with SIGTERM when one fails; exiting through
    # SystemExit runs the cleanup of an atomic write that is under way.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    experiment.main_console(train_reward_model_ex, observe=rank == 0)


if __name__ == "__main__":  # pragma: no cover
    main_console()
