"""``resume_from`` for the online experiments: the config keys, hooks and run start.

:func:`add_resume` gives an experiment the ``resume_from`` key; a resumed run then
takes the run directory and seed of the run it continues (unless given), its config
is checked against the checkpoint's before anything is written, and
:func:`resumed_checkpoint` tells the main function where to continue from. The
checkpoint files are :mod:`imitation_accum.io.run_checkpoint`'s.
"""

import dataclasses
import pathlib
from typing import Any, Dict, Mapping, Optional, Sequence

import sacred

from imitation_accum import _validation
from imitation_accum.io import run_checkpoint

#: Keys every online experiment's resumed run may change (logged when they do).
MAY_CHANGE = (
    "total_timesteps",
    "logging.",
    "resume_from",
    "checkpoint_interval",
    "policy_evaluation.",
    "trust_pickle",
)


def experiment_of(config: Mapping[str, Any]) -> str:
    """Which experiment a run's ``config.json`` is of (by the keys only it has)."""
    if "total_comparisons" in config and "fragment_length" in config:
        return "train_preference_comparisons"
    if "algorithm_kwargs" in config and "demonstrations" in config:
        return "train_adversarial"
    if "dataset_path" in config:
        return "train_reward_model"
    return "another experiment"


@dataclasses.dataclass(frozen=True)
class Resumes:
    """How one experiment resumes.

    Attributes:
        experiment: The experiment's name (recorded in its checkpoints).
        may_change: Config keys a resumed run may change (``"a."``: all under a).
        pickled: Checkpoint files that are pickles, loaded only with the
            ``trust_pickle`` key.
    """

    experiment: str
    may_change: Sequence[str]
    pickled: Sequence[str] = ()

    def locate(self, resume_from: Any) -> run_checkpoint.Located:
        """The checked checkpoint (or run) ``resume_from`` names."""

        def other(config: Mapping[str, Any]) -> Optional[str]:
            found = experiment_of(config)
            return None if found == self.experiment else found

        return run_checkpoint.locate(resume_from, self.experiment, other)

    def updates(self, updates: Dict[str, Any]) -> Dict[str, Any]:
        """An update hook: ``resume_from=RUN_DIR`` takes the run's directory and seed.

        Either is kept if the user gives it.
        """
        resume_from = updates.get("resume_from")
        if resume_from is None:
            return updates
        located = self.locate(resume_from)
        logging_updates = updates.setdefault("logging", {})
        if (located.run_dir / run_checkpoint.CONFIG).is_file():
            logging_updates.setdefault("log_dir", str(located.run_dir))
        if "seed" in located.config:
            updates.setdefault("seed", located.config["seed"])
        return updates

    def check(
        self, config: Dict[str, Any], command_name: str, logger: Any
    ) -> Dict[str, Any]:
        """A config hook: ``resume_from`` names a checkpoint of a run with this config.

        Also of this command (``airl`` does not resume ``gail``). Keys that may
        change and do are logged.
        """
        trusted = bool(self.pickled) and _validation.boolean(
            "trust_pickle", config["trust_pickle"]
        )
        resume_from = config["resume_from"]
        if resume_from is None:
            return {}
        located = self.locate(resume_from)
        where = str(located.checkpoint or located.run_dir / run_checkpoint.CONFIG)
        shown = f"resume_from={str(resume_from)!r} ({where})"
        command = located.manifest.get("command")
        if command is not None and command != command_name:
            raise ValueError(
                f"{shown} is a checkpoint of the {command!r} command, not of "
                f"{command_name!r}: resume it with {command!r}"
            )
        pickles = [f for f in self.pickled if f in located.manifest.get("files", {})]
        if pickles and not trusted:
            raise ValueError(
                f"{shown} holds {', '.join(pickles)}, a pickle, and loading a "
                "pickle runs any code it holds: set trust_pickle=True if you trust "
                "the checkpoint"
            )
        changed = run_checkpoint.compare_configs(
            located.config,
            run_checkpoint.json_config({**config, "seed": config.get("seed")}),
            may_change=self.may_change,
            where=shown,
            hint=" (give the same named configs and updates)",
        )
        for key, before, after in changed:
            if key != "resume_from":
                logger.info(f"Resuming with {key}={after} (the run had {before})")
        return {}


def add_resume(
    ex: Any,
    experiment: str,
    may_change: Sequence[str] = MAY_CHANGE,
    pickled: Sequence[str] = (),
) -> Resumes:
    """Gives ``ex`` (a ``PatchedExperiment``) the ``resume_from`` key and its checks.

    With ``pickled`` (:attr:`Resumes.pickled`), also the ``trust_pickle`` key.

    Returns:
        What the main function asks (:func:`resumed_checkpoint`).
    """
    resumes = Resumes(experiment, tuple(may_change), tuple(pickled))

    def resume_config() -> None:
        resume_from = None  # a run directory (or one of its checkpoints) to continue
        locals()  # quieten flake8

    def trust_config() -> None:
        trust_pickle = False  # resume_from: load its pickles (they run any code)
        locals()  # quieten flake8

    if pickled:
        ex.config(trust_config)

    def check_resume(
        config: Dict[str, Any], command_name: str, logger: Any
    ) -> Dict[str, Any]:
        return resumes.check(config, command_name, logger)

    check_resume.__doc__ = Resumes.check.__doc__
    ex.config(resume_config)
    ex.update_hooks.append(resumes.updates)
    ex.config_hook(check_resume)
    return resumes


def resumed_checkpoint(
    resumes: Resumes, resume_from: Any, run: sacred.run.Run
) -> Optional[pathlib.Path]:
    """Where the main function of a run continues: a checkpoint, or ``None``.

    ``None``: from the start (no ``resume_from``, or a run stopped before its first
    checkpoint). Checkpoints of the run directory later than the one resumed are
    removed (logged): the run goes on from the earlier one.
    """
    if resume_from is None:
        return None
    located = resumes.locate(resume_from)
    log_dir = pathlib.Path(run.config["logging"]["log_dir"])
    count = 0 if located.checkpoint is None else int(located.checkpoint.name)
    if log_dir.resolve() == located.run_dir.resolve():
        for later in run_checkpoint.remove_after(log_dir, count):
            run.run_logger.info(f"Removed {later}, later than the checkpoint resumed")
    return located.checkpoint
