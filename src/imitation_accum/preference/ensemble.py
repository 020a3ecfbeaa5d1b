"""Ensembles: each member of a ``RewardEnsemble`` trained like a plain net."""

import inspect
from typing import Any, List, Mapping, Optional

import numpy as np
from imitation.algorithms import preference_comparisons as pc

from imitation_accum.preference.trainer import CrossEntropyRewardTrainer


class EnsembleTrainer(CrossEntropyRewardTrainer, pc.EnsembleTrainer):
    """A drop-in for imitation's ``EnsembleTrainer``, each member exact.

    imitation's bagging (a resample per member, drawn from ``rng``) and
    member-averaged metrics; each member is a :class:`CrossEntropyRewardTrainer`.

    Args:
        preference_model: The preference model of a ``RewardEnsemble``.
        *args: The further arguments of :class:`CrossEntropyRewardTrainer`, in its
            order; each member trainer gets them too.
        **kwargs: Its keyword arguments.
    """

    _for_ensembles = True

    def __init__(
        self,
        preference_model: pc.PreferenceModel,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__(preference_model, *args, **kwargs)
        # The members take the same arguments, with this trainer's rng and logger.
        bound = inspect.signature(CrossEntropyRewardTrainer).bind(
            preference_model, *args, **kwargs
        )
        member_arguments = dict(
            bound.arguments, rng=self.rng, custom_logger=self.logger
        )
        self.member_trainers = []
        for member_pref_model in self._preference_model.member_pref_models:
            member_arguments["preference_model"] = member_pref_model
            self.member_trainers.append(CrossEntropyRewardTrainer(**member_arguments))

    def _logger_followers(self) -> List[Any]:
        """The regularizer and every member trainer share this trainer's logger."""
        members = list(getattr(self, "member_trainers", []))
        return super()._logger_followers() + members

    # imitation's bagging and metric averaging, reused as is: it only calls
    # ``train`` on the member trainers and reads the logger.
    _train = pc.EnsembleTrainer._train  # type: ignore[assignment]


def make_reward_trainer(
    preference_model: pc.PreferenceModel,
    loss: pc.RewardLoss,
    rng: np.random.Generator,
    reward_trainer_kwargs: Optional[Mapping[str, Any]] = None,
) -> CrossEntropyRewardTrainer:
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
