"""Resuming ``train_reward_model`` from a training state: what must match, what wins.

A checkpoint resumes only on the data and held-out split it was trained on; the
configured ``lr`` and ``optimizer_kwargs`` win over the checkpoint's, and the
run log says which changed.
"""

from typing import Any, Mapping

from imitation.util import logger as imit_logger

from imitation_accum import checkpoint

#: Metadata kept for messages, not compared (a dataset may move).
DESCRIPTIVE = ("dataset_path",)


def check_resumable(
    state: checkpoint.TrainingState,
    metadata: Mapping[str, Any],
    path: str,
) -> None:
    """Raises unless ``state`` was written for this run's data and split.

    Args:
        state: The checkpoint's training state.
        metadata: This run's ``dataset_fingerprint``, ``dataset_path``,
            ``held_out_fraction`` and ``held_out_seed``.
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
        if key in DESCRIPTIVE or key == "dataset_fingerprint":
            continue
        if saved.get(key) != value:
            raise ValueError(
                f"resume_from={path!r} was written for {key}="
                f"{saved.get(key)!r}, but this run has {value!r}: resume "
                "with the same dataset_path, held_out_fraction and held_out_seed",
            )


def apply_configured_optimizer(
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
