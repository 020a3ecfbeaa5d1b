r"""imitation's preference-comparisons experiment, training with this package's trainer.

imitation's experiment run under :func:`imitation_accum.patched`:
``reward_trainer_kwargs`` go to :class:`imitation_accum.CrossEntropyRewardTrainer`,
so ``minibatch_size`` accumulates exactly. Added: Atari named configs (``atari_pong``,
..., ``atari_pong_unwrapped``), ``fast``, ``gpu_bf16`` and early config checks::

    python -m imitation_accum.scripts.train_preference_comparisons with atari_pong \
        reward_trainer_kwargs.minibatch_size=8
    python -m imitation_accum.scripts.train_preference_comparisons with \
        configs/pong_24gb.json

The run directory (``output/train_preference_comparisons/<env>/<timestamp>``) holds
the reward net (``checkpoints/final/reward_net.pt``), the agent, logs and
``config.json``; with ``save_preferences=True`` also ``preferences.pkl``, a frame
store recording ``environment.gym_id`` (``train_reward_model`` reads it from there).
Added keys: ``initial_epoch_multiplier`` (imitation's script does not pass one),
``held_out_pairs`` and ``resume_from``. With ``held_out_pairs=N``, after training the
final agent's rollouts give N fresh fragment pairs, labelled by the environment's
reward; the reward net's accuracy on the non-tied ones is printed and returned in the
run's result (``held_out_accuracy``, ``held_out_non_tied_pairs``; sacred's
``run.json``). Unless ``checkpoint_interval < 0``, a checkpoint is written atomically
to ``checkpoints/resume/`` at the end of every iteration
(:mod:`imitation_accum.preference.resumable`); ``resume_from=RUN_DIR`` continues the
run in ``RUN_DIR`` from its latest one, appending to its logs::

    python -m imitation_accum.scripts.train_preference_comparisons with \
        resume_from=output/train_preference_comparisons/.../20260101_120000_abcdef

A resumed run takes the run's seed and directory and must have its config (the same
named configs and updates): a changed key is refused, naming it, unless it may
change (``total_timesteps``, ``logging.*``, ``checkpoint_interval``,
``save_preferences``, ``held_out_pairs``, ``policy_evaluation.*``,
``reward_trainer_kwargs.progress_bar``), which is logged. SIGTERM ends a run with
exit status 143, after the checkpoint write under way.
"""

import contextlib
import functools
import pathlib
from typing import Any, Dict, Mapping, Optional

from imitation.algorithms import preference_comparisons as pc
from imitation.scripts.train_preference_comparisons import (
    train_preference_comparisons_ex as imitation_ex,
)

import imitation_accum
from imitation_accum import _validation
from imitation_accum.integrations import patching, rollout_reward
from imitation_accum.io import run_checkpoint
from imitation_accum.preference import resumable
from imitation_accum.scripts import config_checks, experiment, presets, resume

train_preference_comparisons_ex = experiment.derive(imitation_ex, doc=__doc__)
#: imitation's main command, called by this experiment's.
_imitation_main = imitation_ex.commands["train_preference_comparisons"]


@train_preference_comparisons_ex.config
def initial_epochs() -> None:  # noqa: D103  (a docstring would print in print_config)
    # imitation's script passes none: its PreferenceComparisons default.
    initial_epoch_multiplier = 200.0  # first phase: x reward_trainer_kwargs.epochs
    held_out_pairs = 0  # after training: accuracy on this many fresh pairs (0: off)
    locals()  # quieten flake8


#: ``resume_from``: its key, hooks and checks.
RESUMES = resume.add_resume(
    train_preference_comparisons_ex,
    resumable.EXPERIMENT,
    (
        *resume.MAY_CHANGE,
        "save_preferences",
        "held_out_pairs",
        "reward_trainer_kwargs.progress_bar",
    ),
)


@train_preference_comparisons_ex.main
def train_preference_comparisons(
    initial_epoch_multiplier: float,
    held_out_pairs: int,
    environment: Mapping[str, Any],
    resume_from: Optional[str],
    checkpoint_interval: int,
    _run: Any,
) -> Mapping[str, Any]:
    """Trains a reward model and agent by preference comparisons (imitation's main).

    Checkpoints every iteration and resumes (see the module's docstring).

    Returns:
        What imitation's main returns: the final reward loss and accuracy, rollout
        statistics of the trained policy; with ``held_out_pairs``, the held-out
        accuracy and how many non-tied pairs it is measured on.
    """
    log_dir = pathlib.Path(_run.config["logging"]["log_dir"])
    checkpoint = resume.resumed_checkpoint(RESUMES, resume_from, _run)
    checkpointing = run_checkpoint.Checkpointing(
        log_dir=log_dir if int(checkpoint_interval) >= 0 else None,
        config=run_checkpoint.json_config(_run.config),
        seed=int(_run.config["seed"]),
        resume_from=checkpoint,
    )
    with contextlib.ExitStack() as stack:
        if resume_from is not None:
            formats = _run.config["logging"]["log_format_strs"]
            stack.enter_context(experiment.appending_run_logs(formats))
        stack.enter_context(
            patching.preference_script_run(
                env_id=environment["gym_id"],
                initial_epoch_multiplier=initial_epoch_multiplier,
                comparisons_cls=functools.partial(
                    resumable.ResumablePreferenceComparisons,
                    checkpointing=checkpointing,
                    held_out_pairs=int(held_out_pairs),
                ),
            )
        )
        return _imitation_main()


@train_preference_comparisons_ex.config_hook
def check_added_keys(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: ``initial_epoch_multiplier`` > 0, ``held_out_pairs`` >= 0."""
    del command_name, logger
    _validation.finite_float(
        "initial_epoch_multiplier", config["initial_epoch_multiplier"]
    )
    _validation.non_negative_int("held_out_pairs", config["held_out_pairs"])
    return {}


train_preference_comparisons_ex.own_sections.extend(
    ["reward_trainer_kwargs", "preference_model_kwargs"]
)
train_preference_comparisons_ex.add_alternatives(
    "reward_trainer_kwargs", "minibatch_size", "memory_budget"
)
train_preference_comparisons_ex.config_hook(config_checks.check_environment)
train_preference_comparisons_ex.config_hook(config_checks.check_run_settings)
train_preference_comparisons_ex.update_hooks.append(config_checks.check_logging_updates)
rollout_reward.add_config_key(train_preference_comparisons_ex)

_TRAINER_OWN_ARGUMENTS = ("preference_model", "loss", "rng", "custom_logger")
#: Arguments imitation's script passes the gatherer and fragmenter itself.
_SET_BY_SCRIPT = ("rng", "custom_logger")
#: Top-level keys that take only True or False.
_BOOLEANS = ("save_preferences", "active_selection", "allow_variable_horizon")
#: Top-level keys that are positive whole numbers.
_COUNTS = (
    "total_timesteps",
    "total_comparisons",
    "num_iterations",
    "fragment_length",
)


@train_preference_comparisons_ex.config_hook
def check_reward_trainer_kwargs(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: the experiment's keys are valid, named by key if not.

    Trainer, gatherer and fragmenter arguments, counts, bools, the query schedule,
    the reward net's arguments, and what the training device must allow.
    """
    trainer_kwargs = config["reward_trainer_kwargs"]
    settings, make_optimizer = config_checks.check_reward_trainer_kwargs(
        trainer_kwargs,
        imitation_accum.CrossEntropyRewardTrainer,
        _TRAINER_OWN_ARGUMENTS,
    )
    config_checks.check_preference_model_kwargs(config["preference_model_kwargs"])
    config_checks.check_counts(config, _COUNTS)
    # A float in imitation (fragments are drawn with replacement): 0.5 and 1.5 work.
    _validation.finite_float(
        "transition_oversampling", config["transition_oversampling"]
    )
    for key in ("initial_comparison_frac", "exploration_frac"):
        _validation.probability(key, config[key])
    for key in _BOOLEANS:
        _validation.boolean(key, config[key])
    schedule = config["query_schedule"]
    if not callable(schedule) and schedule not in pc.QUERY_SCHEDULES:
        raise ValueError(
            f"query_schedule={schedule!r} must be one of "
            f"{', '.join(map(repr, pc.QUERY_SCHEDULES))} or a function"
        )
    gatherer_cls = config["gatherer_cls"]
    if not (
        isinstance(gatherer_cls, type)
        and issubclass(gatherer_cls, pc.PreferenceGatherer)
    ):
        raise ValueError(
            f"gatherer_cls={gatherer_cls!r} must be a PreferenceGatherer class"
        )
    config_checks.check_keywords(
        "gatherer_kwargs", config["gatherer_kwargs"], gatherer_cls, _SET_BY_SCRIPT
    )
    config_checks.check_keywords(
        "fragmenter_kwargs",
        config["fragmenter_kwargs"],
        pc.RandomFragmenter,
        _SET_BY_SCRIPT,
    )
    config_checks.check_reward_ingredient(config, command_name)
    config_checks.check_checkpointing(
        config,
        command_name,
        "reward_trainer_kwargs.activation_checkpointing",
        settings.activation_checkpointing,
    )
    trains = command_name == "train_preference_comparisons"
    # Where imitation's script puts the reward net: on the agent's device.
    device = config["rl"]["rl_kwargs"].get("device", "auto")
    config_checks.check_on_device(
        settings, "rl.rl_kwargs.device", device, trains, logger
    )
    if trains:
        config_checks.check_budget_holds_net(
            config,
            command_name,
            "reward_trainer_kwargs.memory_budget",
            settings.memory_budget,
            make_optimizer,
        )
    return {}


FAST: Dict[str, Any] = dict(
    # imitation's `fast` for this experiment and its ingredients, in one.
    total_timesteps=50,
    total_comparisons=5,
    initial_comparison_frac=0.2,
    num_iterations=1,
    fragment_length=2,
    reward_trainer_kwargs=dict(epochs=1),
    environment=dict(num_vec=2, parallel=False, max_episode_steps=5),
    rl=dict(batch_size=2, rl_kwargs=dict(batch_size=2, n_epochs=1)),
    policy=dict(policy_kwargs=dict(ortho_init=False)),  # QR of CNN weights is slow
    policy_evaluation=dict(n_episodes_eval=1),
)

presets.add_named_configs(
    train_preference_comparisons_ex, FAST, presets.preference_config
)
train_preference_comparisons_ex.add_named_config("gpu_bf16", presets.GPU_BF16)


def main_console() -> None:
    """The command line; runs are recorded under ``output/sacred/``.

    SIGTERM ends a run with exit status 143, after the checkpoint write under way.
    """
    experiment.stop_on_signals()
    experiment.main_console(train_preference_comparisons_ex)


if __name__ == "__main__":  # pragma: no cover
    main_console()
