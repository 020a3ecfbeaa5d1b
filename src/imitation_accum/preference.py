"""Drop-in reward trainers for imitation's preference comparisons.

:class:`CrossEntropyRewardTrainer` replaces imitation's ``BasicRewardTrainer`` with
``CrossEntropyRewardLoss`` (same constructor arguments and defaults) and
:class:`EnsembleTrainer` replaces its ``EnsembleTrainer``. Any ``minibatch_size``
gives the full-batch update: see the package's exactness contract.
"""

import re
import time
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    Optional,
    Type,
    Union,
)

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types
from imitation.regularization import regularizers
from imitation.util import logger as imit_logger
from torch.utils import data as data_th
from tqdm.auto import tqdm

from imitation_accum import (
    _validation,
    accumulation,
    planning,
    preference_data,
    preference_task,
    sampling,
)

Pair = preference_task.Pair


class CrossEntropyRewardTrainer(pc.BasicRewardTrainer):
    """Trains a reward net on preferences, accumulating gradients exactly.

    A drop-in for imitation's ``BasicRewardTrainer`` with ``CrossEntropyRewardLoss``:
    the same arguments and defaults, plus the keyword-only ones below. Every
    optimizer step equals one step on the whole batch, whatever ``minibatch_size``:
    chunk losses are summed and divided by the pairs in the batch, regularizers and
    clipping act once per step, ``RunningNorm``/``EMANorm`` statistics are those of
    one forward over the batch, and logged figures are full-batch figures.

    Batches are drawn from ``rng`` with a fresh permutation every epoch; the last,
    partial batch of an epoch is a plain mean over its own pairs.

    Args:
        preference_model: The preference model whose reward net is trained
            (not an ensemble: see :class:`EnsembleTrainer`).
        loss: imitation's ``CrossEntropyRewardLoss``.
        rng: Draws the batches and the validation split.
        batch_size: Fragment pairs per optimizer step.
        minibatch_size: Fragment pairs per forward/backward, any value in
            ``[1, batch_size]``; ``None`` means the whole batch.
        epochs: Epochs per call of ``train`` (times its ``epoch_multiplier``).
        lr: Learning rate.
        custom_logger: Where to log; a new logger if ``None``.
        regularizer_factory: Builds an imitation regularizer, applied once per
            step; its lambda updater gets item-weighted train and validation losses.
        forward_size: Transitions per reward-net call, or ``"auto"`` to time a few
            sizes on the first minibatch (cached per net architecture, input shape
            and device; the choice is logged as ``forward_size``).
        drop_last: Drop each epoch's last batch if it is partial.
        max_grad_norm: Clip the gradient norm to this once per step.
        progress_bar: Show a tqdm progress bar over steps.
        optimizer_cls: The optimizer (imitation uses AdamW).
        optimizer_kwargs: Further optimizer arguments (``lr`` is passed already).

    Raises:
        ValueError: if an argument is out of range (named in the message).
        TypeError: if ``loss`` is not a ``CrossEntropyRewardLoss`` or the
            preference model is an ensemble or overrides how it computes
            probabilities.

    Example:
        >>> from imitation_accum import CrossEntropyRewardTrainer  # doctest: +SKIP
        >>> trainer = CrossEntropyRewardTrainer(  # doctest: +SKIP
        ...     pc.PreferenceModel(reward_net),
        ...     pc.CrossEntropyRewardLoss(),
        ...     rng=np.random.default_rng(0),
        ...     batch_size=64,
        ...     minibatch_size=8,
        ... )
        >>> trainer.train(dataset)  # doctest: +SKIP
    """

    _for_ensembles = False

    def __init__(
        self,
        preference_model: pc.PreferenceModel,
        loss: pc.RewardLoss,
        rng: np.random.Generator,
        batch_size: int = 32,
        minibatch_size: Optional[int] = None,
        epochs: int = 1,
        lr: float = 1e-3,
        custom_logger: Optional[imit_logger.HierarchicalLogger] = None,
        regularizer_factory: Optional[regularizers.RegularizerFactory] = None,
        *,
        forward_size: Union[int, str] = "auto",
        drop_last: bool = False,
        max_grad_norm: Optional[float] = None,
        progress_bar: bool = True,
        optimizer_cls: Type[th.optim.Optimizer] = th.optim.AdamW,
        optimizer_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        _check_preference_model(preference_model, ensemble=self._for_ensembles)
        if type(loss).forward is not pc.CrossEntropyRewardLoss.forward:
            raise TypeError(
                "loss must be imitation's CrossEntropyRewardLoss (the loss this "
                f"trainer accumulates exactly), got {type(loss).__name__}",
            )
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
        self.batch_size = _validation.positive_int("batch_size", batch_size)
        self.minibatch_size: Optional[int] = _validation.optional_positive_int(  # type: ignore[assignment]
            "minibatch_size",
            minibatch_size,
        )
        _validation.minibatch_within_batch(
            "minibatch_size",
            self.minibatch_size,
            "batch_size",
            self.batch_size,
        )
        self.epochs = _validation.positive_int("epochs", epochs)
        lr = _validation.positive_finite_float("lr", lr)
        self.forward_size = _validation.forward_size_arg(forward_size)
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be a bool, got {drop_last!r}")
        self.drop_last = drop_last
        self.max_grad_norm = (
            None
            if max_grad_norm is None
            else _validation.positive_finite_float("max_grad_norm", max_grad_norm)
        )
        self.progress_bar = progress_bar

        # imitation's BasicRewardTrainer.__init__ insists that batch_size be a
        # multiple of minibatch_size; skip it and set up the same attributes.
        pc.RewardTrainer.__init__(self, preference_model, custom_logger)
        self.loss = loss
        self.rng = rng
        self.optim = optimizer_cls(  # type: ignore[assignment]
            self._preference_model.parameters(),
            **{"lr": lr, **(optimizer_kwargs or {})},
        )
        self.regularizer = (
            regularizer_factory(optimizer=self.optim, logger=self.logger)
            if regularizer_factory is not None
            else None
        )
        self._task = preference_task.task_for(preference_model)
        self._gt_probabilities: Optional[np.ndarray] = None
        self._forward_sizes: Dict[int, int] = {}
        self._engine: Optional[accumulation.GradientAccumulator] = None
        if not self._for_ensembles:
            self._engine = self._make_engine()

    def _make_engine(self) -> accumulation.GradientAccumulator:
        """The accumulation engine for this trainer's reward net (a hook)."""
        return accumulation.GradientAccumulator(
            self._preference_model.model,
            self.optim,
            regularizer=self.regularizer,
            max_grad_norm=self.max_grad_norm,
        )

    def _local_items(self, indices: np.ndarray) -> np.ndarray:
        """The share of ``indices`` this process computes (a hook: all of them).

        Losses are always divided by the size of the whole batch.
        """
        return indices

    @property
    def logger(self) -> imit_logger.HierarchicalLogger:
        """The logger; setting it also redirects the regularizer's records."""
        return self._logger

    @logger.setter
    def logger(self, custom_logger: imit_logger.HierarchicalLogger) -> None:
        self._logger = custom_logger
        regularizer = getattr(self, "regularizer", None)
        if regularizer is not None:
            regularizer.logger = custom_logger

    @property
    def engine(self) -> accumulation.GradientAccumulator:
        """The accumulation engine stepping this trainer's reward net."""
        assert self._engine is not None
        return self._engine

    def _train(self, dataset: data_th.Dataset, epoch_multiplier: float = 1.0) -> None:
        """Trains for ``round(epochs * epoch_multiplier)`` epochs over ``dataset``."""
        table = preference_data.read_preferences(dataset)
        epochs = round(self.epochs * epoch_multiplier)
        if epochs < 1:
            raise ValueError(
                f"round(epochs * epoch_multiplier) = round({self.epochs} * "
                f"{epoch_multiplier}) = {epochs}: must train at least one epoch",
            )
        train_idx = np.arange(len(table))
        val_idx = None
        if self.requires_regularizer_update:
            assert self.regularizer is not None and self.regularizer.val_split
            train_idx, val_idx = sampling.split_validation(
                self.rng,
                len(table),
                self.regularizer.val_split,
            )
        steps_per_epoch = len(train_idx) // self.batch_size
        if not self.drop_last and len(train_idx) % self.batch_size:
            steps_per_epoch += 1
        if steps_per_epoch == 0:
            raise ValueError(
                f"drop_last=True with {len(train_idx)} training comparisons and "
                f"batch_size={self.batch_size}: no batch to train on",
            )
        self._task.refresh_device()
        self._forward_sizes = {}
        self._gt_probabilities = self._task.ground_truth_probabilities(table)

        progress = tqdm(
            total=epochs * steps_per_epoch,
            desc="Training reward model",
            unit="step",
            disable=not self.progress_bar,
        )
        last_postfix = 0.0
        with progress, self.logger.accumulate_means("reward"):
            for epoch_num in range(epochs):
                batches = sampling.epoch_batches(
                    self.rng,
                    train_idx,
                    self.batch_size,
                    self.drop_last,
                )
                epoch_loss_sum, epoch_items = 0.0, 0
                with self.logger.add_key_prefix(f"epoch-{epoch_num}"):
                    for batch in batches:
                        with self.logger.add_key_prefix("train"):
                            result = self._train_step(table, batch)
                        epoch_loss_sum += result.loss * result.n_items
                        epoch_items += result.n_items
                        progress.update()
                        if time.perf_counter() - last_postfix > 0.5:
                            last_postfix = time.perf_counter()
                            progress.set_postfix(_postfix(result), refresh=False)
                    if val_idx is not None:
                        train_loss = epoch_loss_sum / epoch_items
                        self._update_regularizer(table, val_idx, train_loss)
        self._record_final_values(epoch_num)

    def _train_step(
        self,
        table: preference_data.PreferenceTable,
        batch: np.ndarray,
    ) -> accumulation.StepResult:
        chunks = self._make_chunks(table, self._local_items(batch))
        forward_size = self._forward_size_for(chunks[0]) if chunks else 1
        self._task.forward_size = forward_size
        net_calls = sum(
            planning.n_calls(c.layout.n_transitions, forward_size) for c in chunks
        )
        result = self.engine.step(
            self._task,
            chunks,
            n_items=len(batch),
            net_calls=net_calls,
        )
        self.logger.record("loss", result.loss)
        self.logger.record("accuracy", result.metrics["accuracy"])
        if self._gt_probabilities is not None:
            gt_loss = preference_task.cross_entropy(
                self._gt_probabilities[batch],
                table.preferences[batch],
            )
            self.logger.record("gt_reward_loss", gt_loss)
        self.logger.record("grad_norm", result.grad_norm)
        self.logger.record("pairs_per_second", result.n_items / result.seconds)
        self.logger.record("minibatches_per_step", result.n_minibatches)
        self.logger.record("peak_memory_mib", result.peak_memory_bytes / 2**20)
        self.logger.record("forward_size", forward_size)
        return result

    def _make_chunks(
        self,
        table: preference_data.PreferenceTable,
        indices: np.ndarray,
    ) -> List[preference_task.PairChunk]:
        return [
            self._task.make_chunk(table, indices[s])
            for s in planning.plan_chunks(len(indices), self.minibatch_size)
        ]

    def _forward_size_for(self, chunk: preference_task.PairChunk) -> int:
        """Transitions per reward-net call for chunks like ``chunk``."""
        if self.forward_size != "auto":
            return int(self.forward_size)
        n_transitions = chunk.layout.n_transitions
        if n_transitions not in self._forward_sizes:
            self._forward_sizes[n_transitions] = self._tune_forward_size(chunk)
        return self._forward_sizes[n_transitions]

    def _tune_forward_size(self, chunk: preference_task.PairChunk) -> int:
        net = self._task.net
        device = self._task.device
        frame = types.assert_not_dictobs(chunk.layout.fragments[0].obs)
        key = planning.architecture_key(net, frame.shape[1:], frame.dtype, str(device))
        params: List[th.Tensor] = list(net.parameters())

        def time_call(size: int) -> float:
            with accumulation.forked_rng(device), self.engine.norms.frozen():
                return planning.time_forward_backward(
                    lambda: self._task.call(chunk.layout, 0, size),
                    params,
                    device,
                )

        size = planning.tuned_forward_size(key, chunk.layout.n_transitions, time_call)
        self.logger.log(f"forward_size: {size} transitions per reward-net call")
        return size

    def _update_regularizer(
        self,
        table: preference_data.PreferenceTable,
        val_idx: np.ndarray,
        train_loss: float,
    ) -> None:
        assert self.regularizer is not None
        chunks = self._make_chunks(table, self._local_items(val_idx))
        if chunks:
            self._task.forward_size = self._forward_size_for(chunks[0])
        val = self.engine.evaluate(self._task, chunks, n_items=len(val_idx))
        if not (np.isfinite(val.loss) and np.isfinite(train_loss)):
            raise FloatingPointError(
                f"non-finite loss for the lambda updater (train {train_loss}, "
                f"validation {val.loss}); regularization lambda left unchanged",
            )
        with self.logger.add_key_prefix("val"):
            self.logger.record("loss", val.loss)
            self.logger.record("accuracy", val.metrics["accuracy"])
        self.regularizer.update_params(train_loss, val.loss)

    def _record_final_values(self, epoch_num: int) -> None:
        # Same keys as imitation's BasicRewardTrainer._train (which has no hook for
        # this): the last epoch's means again under ``reward/final/``.
        outer_prefix = self.logger.get_accumulate_prefixes()
        base_path = f"{outer_prefix}reward/"
        pattern = re.compile(rf"mean/{re.escape(base_path)}epoch-{epoch_num}/(.+)")
        for key in list(self.logger.name_to_value.keys()):
            if match := pattern.fullmatch(key):
                value = self.logger.name_to_value[key]
                self.logger.record(f"{base_path}final/{match.group(1)}", value)


class EnsembleTrainer(CrossEntropyRewardTrainer, pc.EnsembleTrainer):
    """Trains each member of a ``RewardEnsemble`` like a plain trainer would.

    A drop-in for imitation's ``EnsembleTrainer``: the same arguments, bagging
    (each member trains on its own resample of the dataset, drawn from ``rng``) and
    member-averaged metrics; each member gets every guarantee of
    :class:`CrossEntropyRewardTrainer`. Arguments as there.
    """

    _for_ensembles = True

    def __init__(
        self,
        preference_model: pc.PreferenceModel,
        loss: pc.RewardLoss,
        rng: np.random.Generator,
        batch_size: int = 32,
        minibatch_size: Optional[int] = None,
        epochs: int = 1,
        lr: float = 1e-3,
        custom_logger: Optional[imit_logger.HierarchicalLogger] = None,
        regularizer_factory: Optional[regularizers.RegularizerFactory] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            preference_model,
            loss,
            rng,
            batch_size,
            minibatch_size,
            epochs,
            lr,
            custom_logger,
            regularizer_factory,
            **kwargs,
        )
        self.member_trainers = [
            CrossEntropyRewardTrainer(
                member_pref_model,
                loss,
                self.rng,
                batch_size,
                minibatch_size,
                epochs,
                lr,
                self.logger,
                regularizer_factory,
                **kwargs,
            )
            for member_pref_model in self._preference_model.member_pref_models
        ]

    @property
    def logger(self) -> imit_logger.HierarchicalLogger:
        """The logger, shared with every member trainer."""
        return self._logger

    @logger.setter
    def logger(self, custom_logger: imit_logger.HierarchicalLogger) -> None:
        self._logger = custom_logger
        regularizer = getattr(self, "regularizer", None)
        if regularizer is not None:
            regularizer.logger = custom_logger
        for member_trainer in getattr(self, "member_trainers", []):
            member_trainer.logger = custom_logger

    # imitation's bagging and metric averaging, reused as is: it only calls
    # ``train`` on the member trainers and reads the logger.
    _train = pc.EnsembleTrainer._train  # type: ignore[assignment]


def make_reward_trainer(
    preference_model: pc.PreferenceModel,
    loss: pc.RewardLoss,
    rng: np.random.Generator,
    reward_trainer_kwargs: Optional[Mapping[str, Any]] = None,
) -> CrossEntropyRewardTrainer:
    """The trainer for ``preference_model``, chosen as imitation chooses it.

    Mirrors imitation's ``_make_reward_trainer``: an ensemble trainer for a reward
    ensemble, a plain one otherwise.

    Args:
        preference_model: The preference model to train.
        loss: imitation's ``CrossEntropyRewardLoss``.
        rng: Draws batches, splits and bagging resamples.
        reward_trainer_kwargs: Further trainer arguments.

    Returns:
        An :class:`EnsembleTrainer` for a reward ensemble, otherwise a
        :class:`CrossEntropyRewardTrainer`.
    """
    kwargs = dict(reward_trainer_kwargs or {})
    cls = (
        EnsembleTrainer
        if preference_model.ensemble_model is not None
        else CrossEntropyRewardTrainer
    )
    return cls(preference_model, loss, rng=rng, **kwargs)


def _check_preference_model(model: pc.PreferenceModel, *, ensemble: bool) -> None:
    if not isinstance(model, pc.PreferenceModel):
        raise TypeError(
            f"preference_model must be a PreferenceModel, got {type(model).__name__}",
        )
    for method in ("forward", "rewards", "probability"):
        if getattr(type(model), method) is not getattr(pc.PreferenceModel, method):
            raise TypeError(
                f"{type(model).__name__} overrides PreferenceModel.{method}; this "
                "trainer computes imitation's preference model and would ignore it",
            )
    if ensemble and model.ensemble_model is None:
        raise TypeError("EnsembleTrainer needs the PreferenceModel of a RewardEnsemble")
    if not ensemble and model.ensemble_model is not None:
        raise TypeError(
            "the PreferenceModel wraps a RewardEnsemble: use "
            "imitation_accum.EnsembleTrainer (or make_reward_trainer)",
        )


def _postfix(result: accumulation.StepResult) -> Mapping[str, str]:
    return {
        "loss": f"{result.loss:.4f}",
        "acc": f"{result.metrics['accuracy']:.3f}",
        "pairs/s": f"{result.n_items / result.seconds:.1f}",
        "peak": f"{result.peak_memory_bytes / 2**20:.0f}MiB",
    }
