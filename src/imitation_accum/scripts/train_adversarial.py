r"""imitation's AIRL/GAIL experiment, training with this package's discriminators.

imitation's experiment run under :func:`imitation_accum.patched`: ``algorithm_kwargs``
go to :class:`imitation_accum.AIRL` or ``GAIL``, so ``demo_minibatch_size`` (alias
``minibatch_size``) accumulates exactly. Added: Atari named configs (``atari_pong``,
..., ``atari_pong_unwrapped``), ``fast``, and early config checks. Demonstrations:
a local file (:mod:`imitation_accum.integrations.demonstrations` makes one)::

    python -m imitation_accum.scripts.train_adversarial airl with atari_pong \
        demonstrations.path=demos/pong algorithm_kwargs.demo_minibatch_size=128

The run directory (``output/{airl,gail}/<env>/<timestamp>``) holds the reward nets
(``checkpoints/final/reward_{train,test}.pt``), the policy, logs and ``config.json``.

Unless ``checkpoint_interval < 0``, a checkpoint is written atomically to
``checkpoints/resume/`` every ``checkpoint_interval`` rounds (every round if 0) and
after the last (:mod:`imitation_accum.adversarial.resumable`); ``resume_from=RUN_DIR``
continues the run from its latest one, with the same command, named configs and
updates (see ``docs/hardening.md``). SIGTERM ends a run with exit status 143, after
the checkpoint write under way.
"""

import contextlib
import functools
import pathlib
from typing import Any, Dict, Optional

from imitation.scripts import train_adversarial as imitation_script
from imitation.scripts.train_adversarial import train_adversarial_ex as imitation_ex

import imitation_accum
from imitation_accum.adversarial import arguments, resumable
from imitation_accum.integrations import rollout_reward
from imitation_accum.io import run_checkpoint
from imitation_accum.scripts import config_checks, experiment, presets, resume

train_adversarial_ex = experiment.derive(imitation_ex, doc=__doc__)
ALGORITHMS = {"airl": imitation_accum.AIRL, "gail": imitation_accum.GAIL}
#: ``resume_from``: its key, hooks and checks.
RESUMES = resume.add_resume(
    train_adversarial_ex,
    resumable.EXPERIMENT,
    (*resume.MAY_CHANGE, "show_config"),
    pickled=(resumable.REPLAY_BUFFER,),
)


def _train(
    command: str, resume_from: Optional[str], checkpoint_interval: int, _run: Any
) -> Any:
    # imitation's train_adversarial with a resumable AIRL or GAIL.
    log_dir = pathlib.Path(_run.config["logging"]["log_dir"])
    interval = int(checkpoint_interval)
    checkpointing = run_checkpoint.Checkpointing(
        log_dir=log_dir if interval >= 0 else None,
        config=run_checkpoint.json_config(_run.config),
        seed=int(_run.config["seed"]),
        resume_from=resume.resumed_checkpoint(RESUMES, resume_from, _run),
        interval=max(interval, 1),
        trust_pickle=bool(_run.config["trust_pickle"]),
    )
    algo_cls = functools.partial(
        resumable.resumable_class(ALGORITHMS[command]),
        checkpointing=checkpointing,
        command=command,
    )
    with contextlib.ExitStack() as stack:
        if resume_from is not None:
            formats = _run.config["logging"]["log_format_strs"]
            stack.enter_context(experiment.appending_run_logs(formats))
        return imitation_script.train_adversarial(algo_cls=algo_cls)


@train_adversarial_ex.command
def airl(resume_from: Optional[str], checkpoint_interval: int, _run: Any) -> Any:
    """Trains AIRL (see the experiment's help); checkpoints and resumes."""
    return _train("airl", resume_from, checkpoint_interval, _run)


@train_adversarial_ex.command
def gail(resume_from: Optional[str], checkpoint_interval: int, _run: Any) -> Any:
    """Trains GAIL (see the experiment's help); checkpoints and resumes."""
    return _train("gail", resume_from, checkpoint_interval, _run)


for _name in ALGORITHMS:
    train_adversarial_ex.command_docs[_name] = (
        f"Trains {_name.upper()} (imitation_accum.{_name.upper()}) on "
        "demonstrations: the generator with imitation's RL ingredient, the "
        "discriminator with exact gradient accumulation. Main keys: "
        "environment.gym_id, demonstrations.source/path, total_timesteps, "
        "algorithm_kwargs.demo_batch_size and demo_minibatch_size (alias "
        "minibatch_size) or memory_budget, algorithm_kwargs.max_grad_norm; named "
        "configs such as atari_pong and fast."
    )
train_adversarial_ex.own_sections.extend(["algorithm_kwargs"])
train_adversarial_ex.add_alternatives(
    "algorithm_kwargs", "demo_minibatch_size", "minibatch_size", "memory_budget"
)
train_adversarial_ex.config_hook(config_checks.check_environment)
rollout_reward.add_config_key(train_adversarial_ex)


@train_adversarial_ex.config_hook
def check_demonstrations(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: training reads existing demonstrations (``print_config`` none)."""
    if command_name not in ALGORITHMS:  # a config without data is still shown
        return {}
    return config_checks.check_demonstrations(config, command_name, logger)


train_adversarial_ex.config_hook(config_checks.check_run_settings)
train_adversarial_ex.update_hooks.append(config_checks.check_logging_updates)

# Passed by imitation's script itself, or stripped by it before the constructor.
_SCRIPT_ARGUMENTS = ("venv", "demonstrations", "gen_algo", "log_dir", "reward_net")
_STRIPPED = ("shared", "airl", "gail")


@train_adversarial_ex.config_hook
def check_algorithm_kwargs(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: ``algorithm_kwargs`` are valid arguments of AIRL or GAIL, by key.

    Other commands (``print_config``) check them as both algorithms would get them.
    """
    trains = command_name in ALGORITHMS
    for name in [command_name] if trains else list(ALGORITHMS):
        algorithm = ALGORITHMS[name]
        specific = config["algorithm_specific"].get(name, {})
        kwargs = {**config["algorithm_kwargs"], **specific.get("algorithm_kwargs", {})}
        kwargs = {k: v for k, v in kwargs.items() if k not in _STRIPPED}
        config_checks.check_keywords(
            "algorithm_kwargs", kwargs, algorithm, (*_SCRIPT_ARGUMENTS, "custom_logger")
        )
        # The constructors' own checks, each message naming algorithm_kwargs.<key>.
        settings, _ = arguments.check_arguments(kwargs, "algorithm_kwargs.")
        # imitation's AdversarialTrainer moves the reward net to the agent's device.
        device = config["rl"]["rl_kwargs"].get("device", "auto")
        config_checks.check_on_device(
            settings, "rl.rl_kwargs.device", device, trains, logger
        )
    config_checks.check_counts(config, ("total_timesteps",))
    if trains:
        config_checks.check_reward_ingredient(config, command_name)
        disc_opt_cls = kwargs.get("disc_opt_cls", arguments.DISC_OPT_CLS)
        config_checks.check_budget_holds_net(
            config,
            command_name,
            "algorithm_kwargs.memory_budget",
            settings.memory_budget,
            functools.partial(disc_opt_cls, **(kwargs.get("disc_opt_kwargs") or {})),
        )
    return {}


FAST: Dict[str, Any] = dict(
    # imitation's `fast` for this experiment and its ingredients, in one.
    total_timesteps=10,
    algorithm_kwargs=dict(
        demo_batch_size=4, demo_minibatch_size=2, n_disc_updates_per_round=2
    ),
    environment=dict(num_vec=2, parallel=False, max_episode_steps=5),
    rl=dict(batch_size=2, rl_kwargs=dict(batch_size=2, n_epochs=1)),
    policy=dict(policy_kwargs=dict(ortho_init=False)),  # QR of CNN weights is slow
    policy_evaluation=dict(n_episodes_eval=1),
    demonstrations=dict(n_expert_demos=None),
)

presets.add_named_configs(train_adversarial_ex, FAST, presets.adversarial_config)


def main_console() -> None:
    """The command line; runs are recorded under ``output/sacred/``.

    SIGTERM ends a run with exit status 143, after the checkpoint write under way.
    """
    experiment.stop_on_signals()
    experiment.main_console(train_adversarial_ex)


if __name__ == "__main__":  # pragma: no cover
    main_console()
