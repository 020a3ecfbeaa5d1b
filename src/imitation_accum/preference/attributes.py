"""imitation's trainer attributes that code reads and assigns: logger and optim."""

from typing import Any, List

import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.util import logger as imit_logger


class ImitationAttributes(pc.BasicRewardTrainer):
    """Keeps what hangs off ``logger`` and ``optim`` in step when they are assigned.

    imitation's code assigns ``trainer.logger`` (``PreferenceComparisons`` does)
    and may assign ``trainer.optim``; the regularizer, the engine and the planner
    then follow.
    """

    @property
    def logger(self) -> imit_logger.HierarchicalLogger:
        """The logger; setting it also redirects the regularizer's records."""
        return self._logger

    @logger.setter
    def logger(self, custom_logger: imit_logger.HierarchicalLogger) -> None:
        self._logger = custom_logger
        for follower in self._logger_followers():
            follower.logger = custom_logger

    def _logger_followers(self) -> List[Any]:
        """What logs through this trainer's logger (a hook): the regularizer."""
        # May not exist yet: imitation's constructor assigns the logger first.
        regularizer = getattr(self, "regularizer", None)
        return [] if regularizer is None else [regularizer]

    @property  # type: ignore[override]
    def optim(self) -> th.optim.Optimizer:
        """The optimizer (imitation's attribute).

        Assigning another one makes the engine step it and the regularizer use
        it, from the next step on.
        """
        return self._optim

    @optim.setter
    def optim(self, optimizer: th.optim.Optimizer) -> None:
        if not isinstance(optimizer, th.optim.Optimizer):
            raise TypeError(
                "optim must be a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}",
            )
        self._optim = optimizer
        # Each may not exist yet: the constructor assigns optim before them.
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.optimizer = optimizer
        regularizer = getattr(self, "regularizer", None)
        if regularizer is not None:
            regularizer.optimizer = optimizer
        planner = getattr(self, "planner", None)
        if planner is not None:
            planner.profile = None  # its training-state bytes are the old one's
