"""``train_reward_model``'s config hook: every key checked before anything runs.

A wrong value is named by its key (``reward_trainer_kwargs.minibatch_size``,
``held_out_fraction``, ...) before the dataset is loaded or a net is built.
"""

import pathlib
from typing import Any, Dict

from imitation_accum import _validation, distributed
from imitation_accum.engine import acceleration
from imitation_accum.preference import arguments
from imitation_accum.scripts import config_checks, ingredients

#: Trainer arguments ``train_reward_model`` sets itself (not configurable).
SET_BY_EXPERIMENT = (
    "preference_model",
    "loss",
    "rng",
    "custom_logger",
    "regularizer_factory",
    "process_group",
)


def check_config(
    config: Dict[str, Any],
    command_name: str,
    logger: Any,
) -> Dict[str, Any]:
    """Config hook: every key checked before anything is loaded or built.

    The files (``dataset_path``, ``resume_from``) are needed only to train:
    ``print_config`` and the other commands run without them.
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
    kwargs = config["reward_trainer_kwargs"]
    accepted = ingredients.accepted_keywords(
        distributed.DistributedRewardTrainer,
        exclude=SET_BY_EXPERIMENT,
    )
    key = "reward_trainer_kwargs"
    ingredients.check_keywords(key, kwargs, accepted, "CrossEntropyRewardTrainer")
    optimizer_cls = config_checks.optimizer_class(kwargs.get("optimizer_cls", "AdamW"))
    arguments.check_trainer_values(kwargs, f"{key}.", optimizer_cls)
    config_checks.warn_budget_beyond_machine(
        logger, f"{key}.memory_budget", kwargs.get("memory_budget")
    )
    _validation.positive_int(f"{key}.epochs", kwargs.get("epochs", 1))
    acceleration.Acceleration.parse(kwargs.get("acceleration"), f"{key}.acceleration")
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
