"""Ensembles: each member of a ``RewardEnsemble`` trained like a plain net."""

import inspect
from typing import Any, Mapping, Optional

import numpy as np
from imitation.algorithms import preference_comparisons as pc

from imitation_accum.engine import arguments as engine_arguments
from imitation_accum.preference import arguments
from imitation_accum.preference.trainer import CrossEntropyRewardTrainer


class EnsembleTrainer(pc.EnsembleTrainer):
    """A drop-in for imitation's ``EnsembleTrainer``, each member exact.

    imitation's bagging (a resample per member, drawn from ``rng``) and
    member-averaged metrics (its ``_train``); each member is a
    :class:`CrossEntropyRewardTrainer` built from the same arguments, with this
    trainer's ``rng`` and logger.

    Args:
        preference_model: The preference model of a ``RewardEnsemble``.
        *args: The further arguments of :class:`CrossEntropyRewardTrainer`, in its
            order.
        **kwargs: Its keyword arguments.

    Raises:
        TypeError: if ``preference_model`` is not an ensemble's (imitation's
            message), and as :class:`CrossEntropyRewardTrainer` raises.
        ValueError: as :class:`CrossEntropyRewardTrainer` raises.
    """

    def __init__(
        self,
        preference_model: pc.PreferenceModel,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        arguments.check_preference_model(preference_model, ensemble=True)
        bound = inspect.signature(CrossEntropyRewardTrainer).bind(
            preference_model, *args, **kwargs
        )
        given = dict(bound.arguments)
        bound.apply_defaults()
        settings = bound.arguments
        members = preference_model.member_pref_models
        # The first member checks the arguments before a default logger opens
        # its files; every member shares its logger and this trainer's rng.
        first = CrossEntropyRewardTrainer(**{**given, "preference_model": members[0]})
        # imitation's BasicRewardTrainer.__init__ insists that batch_size be a
        # multiple of minibatch_size; the members checked the arguments instead.
        pc.RewardTrainer.__init__(self, preference_model, first.logger)
        self.rng = first.rng
        self._first_member = first
        self.member_trainers = [first] + [
            CrossEntropyRewardTrainer(
                **{**given, "preference_model": member, "custom_logger": self.logger}
            )
            for member in members[1:]
        ]  # type: ignore[assignment]  # imitation types them BasicRewardTrainer
        # imitation's attributes of an ensemble trainer; its own optimizer and
        # regularizer step nothing (checkpoints keep them, as imitation has them).
        self.loss = settings["loss"]
        self.batch_size = settings["batch_size"]
        self.minibatch_size = settings["minibatch_size"]
        self.epochs = settings["epochs"]
        self.optim = engine_arguments.make_optimizer(  # type: ignore[assignment]
            preference_model.parameters(),
            settings["optimizer_cls"],
            settings["optimizer_kwargs"],
            defaults={"lr": settings["lr"]},
        )
        self.regularizer = engine_arguments.make_regularizer(
            "regularizer_factory",
            settings["regularizer_factory"],
            self.optim,
            self.logger,
        )

    def train(
        self, dataset: pc.PreferenceDataset, epoch_multiplier: float = 1.0
    ) -> None:
        """Imitation's ``train``: each member on its own resample of ``dataset``.

        Raises:
            ValueError: before any member trains, naming the pairs of ``dataset``
                that do not fit the reward nets' spaces.
        """
        self._first_member._check_dataset(dataset)
        super().train(dataset, epoch_multiplier)


def make_reward_trainer(
    preference_model: pc.PreferenceModel,
    loss: pc.RewardLoss,
    rng: np.random.Generator,
    reward_trainer_kwargs: Optional[Mapping[str, Any]] = None,
) -> pc.BasicRewardTrainer:
    """The trainer for ``preference_model``, as imitation's ``_make_reward_trainer``.

    Args:
        preference_model: The preference model to train.
        loss: imitation's ``CrossEntropyRewardLoss``.
        rng: Draws batches, splits and bagging resamples.
        reward_trainer_kwargs: Further trainer arguments.

    Returns:
        An :class:`EnsembleTrainer` for a reward ensemble, otherwise a
        :class:`CrossEntropyRewardTrainer`.
    """
    ensemble = preference_model.ensemble_model is not None
    cls = EnsembleTrainer if ensemble else CrossEntropyRewardTrainer
    return cls(preference_model, loss, rng=rng, **(reward_trainer_kwargs or {}))
