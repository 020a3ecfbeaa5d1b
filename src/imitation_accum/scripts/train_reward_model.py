"""Trains a reward net offline from saved preferences, on one process or many.

Example::

    python -m imitation_accum.scripts.train_reward_model with
        dataset_path=output/.../preferences.pkl reward_trainer_kwargs.minibatch_size=8
    torchrun --nproc_per_node=4 -m imitation_accum.scripts.train_reward_model with
        dataset_path=output/.../preferences.pkl

The dataset is a frame store (:meth:`imitation_accum.PreferenceDataset.save`) or
imitation's pickle (``save_preferences=True``), read only with ``trust_pickle=True``
and copied into a frame store in memory (``python -m
imitation_accum.scripts.convert_preferences IN.pkl OUT`` converts one once).
A seeded share of the pairs is held out and evaluated after every epoch. The training
state is checkpointed atomically to ``{log_dir}/checkpoints/training_state.pt``
(continue with ``resume_from=...``), the reward net saved as imitation saves it, to
``{log_dir}/checkpoints/final/reward_net.pt``. Under ``torchrun`` only rank 0 logs and
writes files. As a script, it seeds torch's global generator with the run's seed.
The environment is the one a store recorded (``save_preferences=True`` records it)
unless ``environment.gym_id`` or a named config names one.

Every input (config, data, a checkpoint to resume) is checked before any file is
written: a refused run leaves no run directory, logs or sacred record. A running
run holds ``{log_dir}/run.lock``; a resumed run continues the logs of ``log_dir``,
and a fresh run into a ``log_dir`` that holds an earlier run's logs or checkpoints
is refused.
SIGTERM ends a run with exit status 143 (128 + 15), after the checkpoint write
under way.
"""

import contextlib
import hashlib
import logging
import math
import os
import pathlib
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers, updaters
from imitation.rewards import reward_nets
from imitation.scripts.ingredients import environment, reward, wb
from imitation.scripts.ingredients import logging as logging_ingredient
from imitation.util import logger as imit_logger
from imitation.util import util
from stable_baselines3.common import logger as sb_logger
from torch.utils import data as data_th

from imitation_accum import _validation, checkpoint, distributed
from imitation_accum.engine import arguments as engine_arguments
from imitation_accum.preference import dataset_checks
from imitation_accum.preference.dataset import (
    PreferenceDataset,
    read_imitation_pickle,
)
from imitation_accum.scripts import config_checks, experiment, presets

# Run under imitation_accum.patched(): imitation's reward ingredient then also
# builds CNN reward nets.
train_reward_model_ex = experiment.PatchedExperiment(
    "train_reward_model",
    ingredients=[
        logging_ingredient.logging_ingredient,
        environment.environment_ingredient,
        reward.reward_ingredient,
    ],
)
# Inputs are checked in the main function; its sacred record begins after them.
train_reward_model_ex.records_after_checks = True
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
#: The keys of the ``regularizer`` config.
_REGULARIZER_KEYS = (
    "kind",
    "initial_lambda",
    "p",
    "scaling_factor",
    "tolerable_interval",
    "val_split",
)


@train_reward_model_ex.config
def train_defaults():  # noqa: D103  (a docstring would print in print_config)
    # Defaults: imitation's reward trainer defaults, a tenth held out.
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


for _name, _game in presets.GAMES.items():
    # The preprocessed, score-masked Atari environment and CnnRewardNet of the
    # preference-comparisons experiment's named config of the same name.
    train_reward_model_ex.add_named_config(
        _name,
        {
            "environment": presets.environment(_game)["environment"],
            "reward": presets.reward(),
        },
    )
train_reward_model_ex.add_named_config("gpu_bf16", presets.GPU_BF16)


@train_reward_model_ex.config_hook
def _check_config(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: every key checked, and named if wrong, before anything is built.

    ``dataset_path`` is required only to train (not for ``print_config``).
    """
    trains = command_name == "train_reward_model"
    _validation.boolean("trust_pickle", config["trust_pickle"])
    config_checks.check_run_settings(config, command_name, logger)
    path = config["dataset_path"]
    if path is None and trains:
        raise ValueError(
            "dataset_path is required: a PreferenceDataset saved with "
            "PreferenceDataset.save (train_preference_comparisons with "
            "save_preferences=True writes preferences.pkl)"
        )
    if path is not None and not pathlib.Path(path).exists():
        raise ValueError(f"dataset_path={path!r}: no such file")
    fraction = config["held_out_fraction"]
    if not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"held_out_fraction={fraction!r} must lie in [0, 1)")
    trainer_kwargs = config["reward_trainer_kwargs"]
    settings, make_optimizer = config_checks.check_reward_trainer_kwargs(
        trainer_kwargs,
        distributed.DistributedRewardTrainer,
        _SET_BY_EXPERIMENT,
        _optimizer_class(trainer_kwargs.get("optimizer_cls", "AdamW")),
    )
    config_checks.check_preference_model_kwargs(config["preference_model_kwargs"])
    _validation.non_negative_int("held_out_seed", config["held_out_seed"])
    interval = config["checkpoint_interval"]
    if isinstance(interval, bool) or not isinstance(interval, int):
        raise ValueError(f"checkpoint_interval={interval!r} must be an int")
    resume = config["resume_from"]
    if resume is not None and not pathlib.Path(resume).is_file():
        raise ValueError(f"resume_from={resume!r}: no such file")
    _check_regularizer(config["regularizer"])
    config_checks.check_reward_ingredient(config, "train_reward_model")
    config_checks.check_on_device(settings, "device", config["device"], trains, logger)
    if trains:
        config_checks.check_budget_holds_net(
            config,
            "train_reward_model",
            "reward_trainer_kwargs.memory_budget",
            settings.memory_budget,
            make_optimizer,
        )
    config_checks.check_checkpointing(
        config,
        "train_reward_model",
        "reward_trainer_kwargs.activation_checkpointing",
        settings.activation_checkpointing,
    )
    distributed.process_group.check_timeout(
        "collective_timeout_s", config["collective_timeout_s"]
    )
    return {}


@train_reward_model_ex.config_hook
def _check_environment(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: the environment keys; ``env_make_kwargs`` where ``gym_id`` is set.

    With the default ``gym_id`` a dataset's recorded environment may be used: its
    ``env_make_kwargs`` are then checked once the dataset names it, before
    anything is written.
    """
    del command_name, logger
    env = config["environment"]
    known = env["gym_id"] != _DEFAULT_GYM_ID or config["dataset_path"] is None
    config_checks.check_environment_section(env, make_kwargs=known)
    return {}


# Before sacred's config: imitation's logging ingredient fails on a string there.
train_reward_model_ex.update_hooks.append(config_checks.check_logging_updates)


def _check_regularizer(section: Mapping[str, Any]) -> None:
    # The regularizer config, naming the bad key.
    _validation.known_names(
        "regularizer", section, _REGULARIZER_KEYS, "the regularizer config"
    )
    kind = section.get("kind")
    if kind not in (None, "lp", "weight_decay"):
        raise ValueError(
            f"regularizer.kind={kind!r} must be None, 'lp' or 'weight_decay'"
        )
    _validation.finite_float(
        "regularizer.initial_lambda", section.get("initial_lambda"), allow_zero=True
    )
    _validation.finite_float("regularizer.p", section.get("p"))
    factor = section.get("scaling_factor")
    if kind is None or factor is None:
        return
    _validation.finite_float("regularizer.scaling_factor", factor)
    if not factor < 1:
        raise ValueError(f"regularizer.scaling_factor={factor!r} must lie in (0, 1)")
    interval = section.get("tolerable_interval")
    if (
        not isinstance(interval, (list, tuple))
        or len(interval) != 2
        or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in interval)
        or not 0 <= interval[0] < interval[1]
    ):
        raise ValueError(
            f"regularizer.tolerable_interval={interval!r} must be a pair (low, "
            "high) with 0 <= low < high"
        )
    val_split = _validation.finite_float(
        "regularizer.val_split", section.get("val_split")
    )
    if not val_split < 1:
        raise ValueError(f"regularizer.val_split={val_split!r} must lie in (0, 1)")


def _optimizer_class(value: Any) -> type:
    # reward_trainer_kwargs.optimizer_cls: a torch optimizer class, or its name.
    key = "reward_trainer_kwargs.optimizer_cls"
    if isinstance(value, str):
        if not isinstance(getattr(th.optim, value, None), type):
            raise ValueError(f"{key}={value!r} is not an optimizer of torch.optim")
        value = getattr(th.optim, value)
    return engine_arguments.optimizer_class(key, value)


def _load_dataset(path: str, trust_pickle: bool) -> pc.PreferenceDataset:
    # A frame store (memory-mapped), or imitation's pickle if trust_pickle.
    source = pathlib.Path(path)
    if source.is_dir():
        return PreferenceDataset.load(source)
    if not trust_pickle:
        raise ValueError(
            f"dataset_path={path!r} is a pickle, and loading a pickle runs any code "
            "it holds: set trust_pickle=True if you trust the file, or convert it "
            "once with python -m imitation_accum.scripts.convert_preferences "
            f"{path} OUT and train on OUT"
        )
    return read_imitation_pickle(source, f"dataset_path={path!r}")


#: imitation's environment ingredient's default: the config names no environment.
_DEFAULT_GYM_ID = environment.environment_ingredient.configurations[0]()["gym_id"]


def _environment_id(configured: str, dataset: pc.PreferenceDataset) -> str:
    # The configured environment, or the one a store recorded if the config
    # names none (a configured one that differs is checked against the pairs).
    recorded = dataset.env_id if isinstance(dataset, PreferenceDataset) else None
    if configured == _DEFAULT_GYM_ID and recorded is not None:
        return recorded
    return configured


def split_held_out(
    n_pairs: int, fraction: float, seed: int
) -> Tuple[np.ndarray, np.ndarray]:
    """Splits ``range(n_pairs)`` into sorted ``(train, held_out)`` indices by ``seed``.

    ``int(n_pairs * fraction)`` pairs are held out.

    Raises:
        ValueError: if a positive ``fraction`` holds out no pair.
    """
    n_held_out = int(n_pairs * fraction)
    if fraction > 0 and n_held_out == 0:
        raise ValueError(
            f"held_out_fraction={fraction} of {n_pairs} pairs holds out none; "
            "raise it, or set it to 0 to hold out nothing"
        )
    order = np.random.default_rng(seed).permutation(n_pairs)
    return np.sort(order[n_held_out:]), np.sort(order[:n_held_out])


def _check_dataset(
    dataset: pc.PreferenceDataset, env: gym.Env, path: str, gym_id: str
) -> None:
    # Every pair checked against the environment, before any step.
    if isinstance(dataset, PreferenceDataset):
        # A store's frames are checked as a whole first, naming its frames file.
        dataset.check_observation_space(env.observation_space, f"dataset_path={path!r}")
    dataset_checks.check_dataset(
        dataset,
        env.observation_space,
        env.action_space,
        name=f"dataset_path={path!r}",
        environment=f"what environment.gym_id={gym_id!r} gives",
        hint="\nSet environment.gym_id (and env_make_kwargs) to the environment "
        "the preferences came from, or fix the pairs named.",
    )


def _regularizer_factory(
    config: Mapping[str, Any],
) -> Optional[regularizers.RegularizerFactory]:
    if config["kind"] is None:
        return None
    updater = None
    val_split: Any = None  # imitation's annotation says float; None is its default
    if config["scaling_factor"] is not None:
        updater = updaters.IntervalParamScaler(
            config["scaling_factor"], tuple(config["tolerable_interval"])
        )
        val_split = float(config["val_split"])
    if config["kind"] == "lp":
        return regularizers.LpRegularizer.create(
            config["initial_lambda"], updater, val_split, p=config["p"]
        )
    return regularizers.WeightDecayRegularizer.create(
        config["initial_lambda"], updater, val_split
    )


def _check_single_net(net: reward_nets.RewardNet) -> None:
    if any(isinstance(m, reward_nets.RewardEnsemble) for m in net.modules()):
        raise ValueError(
            "reward.net_cls: train_reward_model trains a single reward net, not a "
            "RewardEnsemble; train each member as its own run"
        )


def _check_resumable(
    state: checkpoint.TrainingState,
    metadata: Mapping[str, Any],
    path: str,
    *,
    optimizer_cls: type,
    regularizer_kind: Optional[str],
) -> None:
    # A checkpoint resumes only on the data and held-out split it was trained on,
    # with the optimizer and regularizer it was saved with.
    configured = f"{optimizer_cls.__module__}.{optimizer_cls.__qualname__}"
    if state.optimizer_class != configured:
        raise ValueError(
            f"resume_from={path!r} holds the state of a {state.optimizer_class}, but "
            f"reward_trainer_kwargs.optimizer_cls={optimizer_cls.__name__!r}: resume "
            "with the optimizer the checkpoint was trained with"
        )
    saved_with = state.regularizer_lambda is not None
    if saved_with != (regularizer_kind is not None):
        raise ValueError(
            f"resume_from={path!r} was saved {'with' if saved_with else 'without'} "
            f"a regularizer, but regularizer.kind={regularizer_kind!r}: resume with "
            "the regularizer the checkpoint was trained with"
        )
    saved = state.metadata
    old, new = saved.get("dataset_fingerprint"), metadata["dataset_fingerprint"]
    if old != new:
        raise ValueError(
            f"resume_from={path!r} was trained on the data of "
            f"{saved.get('dataset_path', 'another file')!r} (fingerprint "
            f"{str(old)[:16]}), but dataset_path={metadata['dataset_path']!r} holds "
            f"other data (fingerprint {new[:16]}): resume with the dataset the "
            "checkpoint was trained on"
        )
    for key in ("dataset_pairs", "held_out_split"):  # not dataset_path: files move
        if saved.get(key) != metadata[key]:
            raise ValueError(
                f"resume_from={path!r} was written for {key}={saved.get(key)!r}, but "
                f"this run has {metadata[key]!r}: resume with the same "
                "dataset_path, held_out_fraction and held_out_seed"
            )


def _apply_configured_optimizer(
    trainer: Any,
    trainer_kwargs: Mapping[str, Any],
    custom_logger: imit_logger.HierarchicalLogger,
) -> None:
    # The configured lr and optimizer_kwargs win over a checkpoint's, and say so.
    configured = {
        "lr": trainer_kwargs.get("lr", 1e-3),
        **(trainer_kwargs.get("optimizer_kwargs") or {}),
    }
    changed = checkpoint.apply_hyperparameters(trainer.optim, configured)
    for name, (old, new) in changed.items():
        key = "lr" if name == "lr" else f"optimizer_kwargs.{name}"
        custom_logger.log(
            f"Resuming with reward_trainer_kwargs.{key}={new!r}, not the "
            f"checkpoint's {old!r}: the configured value is applied"
        )


@contextlib.contextmanager
def _run_directory(
    context: distributed.DistributedContext, run: Any, resumed: bool
) -> Iterator[Tuple[imit_logger.HierarchicalLogger, Optional[pathlib.Path]]]:
    # Rank 0, once every input is accepted: the run directory locked (and refused
    # if a fresh run would overwrite an earlier one), the sacred record begun,
    # config.json written, the logger (continuing a resumed run's logs). The other
    # ranks get a logger that keeps nothing.
    if not context.is_main:
        with tempfile.TemporaryDirectory(prefix="train_reward_model-") as scratch:
            yield imit_logger.configure(folder=scratch, format_strs=[]), None
        return
    config = run.config["logging"]
    run_dir = util.parse_path(config["log_dir"])
    with experiment.lock_run_directory(run_dir):
        train_reward_model_ex.run_directory = run_dir
        if not resumed:
            state = run_dir / "checkpoints" / checkpoint.TRAINING_STATE_NAME
            experiment.refuse_earlier_run(
                run_dir, resume_from=state if state.is_file() else None
            )
        experiment.begin_record(run)
        log_dir = logging_ingredient.make_log_dir()  # links the sacred record
        experiment.write_config(run.config, log_dir)
        formats = config["log_format_strs"]
        if "wandb" in formats:  # as imitation's setup_logging does
            wb.wandb_init(log_dir=str(log_dir))
        custom_logger = experiment.configure_logger(log_dir / "log", formats, resumed)
        try:
            yield custom_logger, log_dir
        finally:
            custom_logger.close()


def _quiet_logger() -> imit_logger.HierarchicalLogger:
    # A logger that opens no file: the trainer's until the run directory opens.
    return imit_logger.HierarchicalLogger(sb_logger.Logger(None, []), [])


def _agreed_seed(context: distributed.DistributedContext, seed: int) -> int:
    # Rank 0's seed on every rank (sacred draws one per process if none is set).
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
    _run: Any,
) -> Mapping[str, Any]:
    """Trains a reward net on the preferences in ``dataset_path`` (see the config).

    Returns:
        Held-out figures per epoch and the paths of the saved files (rank 0).
    """
    with contextlib.ExitStack() as stack:
        context = stack.enter_context(
            distributed.distributed_session(device, timeout_s=collective_timeout_s)
        )
        experiment.exit_if_stopped()  # a stop signal sacred's code swallowed
        kwargs = dict(reward_trainer_kwargs)
        epochs = int(kwargs.pop("epochs", 1))
        kwargs["optimizer_cls"] = _optimizer_class(kwargs.get("optimizer_cls", "AdamW"))
        batch_size = int(kwargs.get("batch_size", 32))
        distributed.check_batch_size(
            "reward_trainer_kwargs.batch_size", batch_size, context.world_size
        )
        seed = _agreed_seed(context, _seed)
        # A script's choice, as imitation's scripts make it: torch's global
        # generator (the reward net's initial weights) is seeded from the run's seed.
        th.manual_seed(seed)

        loaded = _load_dataset(dataset_path, trust_pickle)
        gym_id = _environment_id(environment["gym_id"], loaded)
        config_checks.check_env_make_kwargs(gym_id, environment["env_make_kwargs"])
        env = gym.make(gym_id, **environment["env_make_kwargs"])
        env.close()  # only its spaces are read, as the reward ingredient reads a venv's
        _check_dataset(loaded, env, dataset_path, gym_id)
        dataset = (  # one path for the data, one fingerprint: a pickle is copied
            loaded
            if isinstance(loaded, PreferenceDataset)
            else PreferenceDataset.of_pairs(loaded)
        )
        del loaded
        fingerprint = dataset.fingerprint()
        distributed.check_same_on_every_rank(
            context,
            "the data",
            fingerprint,
            shown=f"dataset_path={dataset_path!r}, fingerprint {fingerprint[:16]}",
            advice=": every rank must load the same dataset",
        )
        train_idx, held_out_idx = split_held_out(
            len(dataset), held_out_fraction, held_out_seed
        )
        if len(train_idx) < batch_size:
            raise ValueError(
                f"dataset_path={dataset_path!r} has {len(dataset)} pairs; after "
                f"holding out {len(held_out_idx)} (held_out_fraction="
                f"{held_out_fraction}), {len(train_idx)} remain for training, fewer "
                f"than one batch (reward_trainer_kwargs.batch_size={batch_size})"
            )
        metadata = {
            "dataset_pairs": len(dataset),
            "held_out_split": hashlib.sha256(
                held_out_idx.astype(np.int64).tobytes()
            ).hexdigest(),
            "dataset_fingerprint": fingerprint,
            "dataset_path": str(dataset_path),
        }

        net = reward.make_reward_net(env)
        _check_single_net(net)
        state = None
        if resume_from is not None:
            state = checkpoint.load_training_state(resume_from)
            checkpoint.check_fits(state, net, resume_from)
            _check_resumable(
                state,
                metadata,
                resume_from,
                optimizer_cls=kwargs["optimizer_cls"],
                regularizer_kind=regularizer["kind"],
            )
        net = net.to(context.device)

        # Built before the run directory opens, so that its own checks (memory
        # budget, optimizer arguments) leave no file behind.
        trainer = distributed.DistributedRewardTrainer(
            pc.PreferenceModel(net, **preference_model_kwargs),
            pc.CrossEntropyRewardLoss(),
            np.random.default_rng(seed),
            epochs=1,  # one epoch per train() call, to checkpoint between epochs
            custom_logger=_quiet_logger(),
            regularizer_factory=_regularizer_factory(regularizer),
            **kwargs,
        )
        first_epoch = 0
        if state is not None:
            checkpoint.restore_state(trainer, state, str(resume_from))
            first_epoch = state.epoch
        experiment.exit_if_stopped()

        custom_logger, log_dir = stack.enter_context(
            _run_directory(context, _run, resumed=state is not None)
        )
        trainer.logger = custom_logger
        if state is not None:
            custom_logger.log(f"Resuming from {resume_from} after epoch {first_epoch}")
            _apply_configured_optimizer(trainer, reward_trainer_kwargs, custom_logger)

        state_path = None
        if log_dir is not None and checkpoint_interval >= 0:
            state_path = log_dir / "checkpoints" / checkpoint.TRAINING_STATE_NAME
            checkpoint.remove_stale_temporaries(state_path)

        def save_state(epoch: int) -> None:
            if state_path is not None:
                captured = checkpoint.capture_state(
                    trainer, epoch=epoch, metadata=metadata
                )
                checkpoint.save_training_state(captured, state_path)

        # Subsets of the store (the trainer reads them from it, no copy).
        train_set: Any = data_th.Subset(dataset, train_idx.tolist())
        held_out_set: Any = data_th.Subset(dataset, held_out_idx.tolist())
        history: List[Dict[str, float]] = []
        for epoch in range(first_epoch + 1, epochs + 1):
            experiment.exit_if_stopped()
            trainer.train(train_set)
            figures: Dict[str, float] = {"epoch": epoch}
            if len(held_out_idx):
                result = trainer.evaluate(held_out_set)
                figures.update(loss=result.loss, accuracy=result.metrics["accuracy"])
            for key, value in figures.items():
                custom_logger.record(
                    key if key == "epoch" else f"held_out/{key}", value
                )
            custom_logger.dump(epoch)
            history.append(figures)
            periodic = checkpoint_interval > 0 and epoch % checkpoint_interval == 0
            if periodic or epoch == epochs:
                save_state(epoch)

        if first_epoch >= epochs:  # nothing trained: still leave a state
            save_state(first_epoch)
        results: Dict[str, Any] = {"epochs": epochs, "held_out": history}
        if log_dir is not None:
            final = log_dir / "checkpoints" / "final" / "reward_net.pt"
            results["reward_net"] = str(checkpoint.save_reward_net(net, final))
        if state_path is not None:
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
    experiment.stop_on_signals()
    experiment.main_console(train_reward_model_ex, observe=rank == 0)


if __name__ == "__main__":  # pragma: no cover
    main_console()
