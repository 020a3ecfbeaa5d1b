"""Drop-in reward trainer for imitation's preference comparisons.

:class:`CrossEntropyRewardTrainer` replaces imitation's ``BasicRewardTrainer`` with
``CrossEntropyRewardLoss`` (same constructor arguments and defaults). Any
``minibatch_size`` gives the full-batch update: see the package's exactness
contract. One step runs ``sampler -> planner -> chunks -> engine``: the batch's
pairs are planned (:class:`~imitation_accum.planning.Planner`), laid out as the
plan says (:func:`~imitation_accum.preference.pair_chunks.make_chunks`) and stepped
by the engine with the plan as its argument.
"""

import copy
import time
from typing import Any, Mapping, Optional, Type, Union

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers
from imitation.util import logger as imit_logger
from torch.utils import data as data_th
from tqdm.auto import tqdm

from imitation_accum import _validation
from imitation_accum.engine import acceleration as acceleration_options
from imitation_accum.engine import checkpointing, precision, staging
from imitation_accum.engine.accumulator import GradientAccumulator
from imitation_accum.engine.task import EvaluationResult, StepResult
from imitation_accum.planning import budget, probe
from imitation_accum.planning.plan import StepPlan
from imitation_accum.planning.planner import Planner
from imitation_accum.preference import (
    arguments,
    memory_plan,
    pair_chunks,
    pair_table,
    pair_task,
    records,
    sampling,
)
from imitation_accum.preference.attributes import ImitationAttributes
from imitation_accum.preference.workload import PairWorkload


class CrossEntropyRewardTrainer(ImitationAttributes):
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
            ``[1, batch_size]``; ``None`` means the whole batch (unless
            ``memory_budget`` is given).
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
        memory_budget: Instead of ``minibatch_size``: bytes, a size such as
            ``"6GiB"`` or ``"500MB"``, or ``"auto"`` (a share of the device's free
            memory, or of the host's available memory on a CPU). A probe
            forward/backward on a few transitions counts the bytes autograd saves
            per transition; chunks are then sized in transitions to fit the
            budget with the parameters, gradients and optimizer state, and when
            one pair does not fit, fragments are split across chunks (two
            passes). The estimate and the chunk size are logged. On CUDA, a step
            that runs out of memory anyway is redone with chunks half as large.
        autocast_dtype: ``"bfloat16"`` or ``"float16"`` to run the reward net
            under ``torch.autocast``; float16 (CUDA only) scales each minibatch's
            loss with a ``GradScaler`` and unscales, clips and steps once per
            batch; steps skipped for overflow are logged (``amp_skipped_steps``).
        activation_checkpointing: Recompute the activations of the net's
            ``CnnRewardNet`` convolutions in the backward instead of keeping them
            (non-reentrant checkpointing; exact).
        two_pass: ``None`` lets the planner choose two passes when one pair does
            not fit, or when it measures them faster (``forward_size="auto"``);
            ``True``/``False`` pins the choice.
        acceleration: Accelerator options, all off by default: an
            :class:`~imitation_accum.engine.acceleration.Acceleration` or a mapping
            of its fields (``pinned_staging``, ``channels_last``, ``compile``,
            ``cudnn_benchmark``); see ``docs/gpu.md``.

    Raises:
        ValueError: if an argument is out of range (named in the message), both
            ``minibatch_size`` and ``memory_budget`` are given, the budget does
            not parse or cannot hold the parameters, gradients and optimizer
            state, or the device cannot run ``autocast_dtype``.
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
        memory_budget: Union[int, str, None] = None,
        autocast_dtype: Optional[str] = None,
        activation_checkpointing: bool = False,
        two_pass: Optional[bool] = None,
        acceleration: acceleration_options.AccelerationArg = None,
    ) -> None:
        arguments.check_preference_model(preference_model, ensemble=self._for_ensembles)
        arguments.check_loss_and_rng(loss, rng)
        batch, minibatch, parsed_budget = arguments.check_minibatching(
            batch_size, minibatch_size, memory_budget
        )
        self.batch_size = batch
        self.minibatch_size: Optional[int] = minibatch  # type: ignore[assignment]
        self.memory_budget = parsed_budget
        self.epochs = _validation.positive_int("epochs", epochs)
        lr = _validation.finite_float("lr", lr, allow_zero=True)
        self.forward_size = _validation.forward_size_arg(forward_size)
        self.autocast_dtype = precision.parse_autocast_dtype(autocast_dtype)
        self.activation_checkpointing = arguments.check_flag(
            "activation_checkpointing", activation_checkpointing
        )
        self.two_pass = arguments.check_optional_flag("two_pass", two_pass)
        self.acceleration = acceleration_options.Acceleration.parse(acceleration)
        self.drop_last = arguments.check_flag("drop_last", drop_last)
        self.max_grad_norm = (
            None
            if max_grad_norm is None
            else _validation.positive_finite_float("max_grad_norm", max_grad_norm)
        )
        self.progress_bar = arguments.check_flag("progress_bar", progress_bar)
        arguments.check_optimizer_kwargs(
            "optimizer_kwargs", optimizer_kwargs, optimizer_cls
        )

        # imitation's BasicRewardTrainer.__init__ insists that batch_size be a
        # multiple of minibatch_size; skip it and set up the same attributes.
        pc.RewardTrainer.__init__(self, preference_model, custom_logger)
        self.loss = loss
        self.rng = rng
        self.optim = optimizer_cls(
            self._preference_model.parameters(),
            **{"lr": lr, **(optimizer_kwargs or {})},
        )
        self.regularizer = (
            regularizer_factory(optimizer=self.optim, logger=self.logger)
            if regularizer_factory is not None
            else None
        )
        self._task = pair_task.task_for(preference_model)
        if self.acceleration.pinned_staging:
            self._task.stager = staging.RangeStager()
        self._gt_losses: Optional[np.ndarray] = None
        self.planner = Planner(
            minibatch_size=self.minibatch_size,
            forward_size=self.forward_size,
            two_pass=self.two_pass,
            log=self._log,
        )
        self.last_plan: Optional[StepPlan] = None
        """The plan of the last step (``forward_size``, ``two_pass``, chunks)."""
        self._engine: Optional[GradientAccumulator] = None
        if not self._for_ensembles:
            self._check_memory_options()
            self._engine = self._make_engine()
            self._engine.configure(
                autocast_dtype=self.autocast_dtype,
                activation_checkpointing=self.activation_checkpointing,
            )

    def _check_memory_options(self) -> None:
        """Checks the budget and precision against the net (before training)."""
        net = self._preference_model.model
        precision.check_supported(self.autocast_dtype, net.device)
        if self.activation_checkpointing:
            checkpointing.check_checkpointable(net)
        budget.check_holds_training_state(self.memory_budget, self.optim)
        self.acceleration.check_net(net, self.activation_checkpointing)
        budget.check_fits_device(self.memory_budget, net.device)

    def train(
        self, dataset: pc.PreferenceDataset, epoch_multiplier: float = 1.0
    ) -> None:
        """Trains as imitation's ``train`` does, with the ``acceleration`` options."""
        options = None if self._for_ensembles else self.acceleration  # per member
        with acceleration_options.maybe_applied(options, self._preference_model.model):
            super().train(dataset, epoch_multiplier)

    def _make_engine(self) -> GradientAccumulator:
        """The accumulation engine for this trainer's reward net (a hook)."""
        return GradientAccumulator(
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

    def _log(self, message: str) -> None:
        self.logger.log(message)

    @property
    def engine(self) -> GradientAccumulator:
        """The accumulation engine stepping this trainer's reward net."""
        assert self._engine is not None
        return self._engine

    @property
    def memory_profile(self) -> Optional[probe.ActivationProfile]:
        """The memory probe's profile of the net, once a budget was planned."""
        return self.planner.profile

    def _train(self, dataset: data_th.Dataset, epoch_multiplier: float = 1.0) -> None:
        """Trains for ``round(epochs * epoch_multiplier)`` epochs over ``dataset``."""
        table = pair_table.read_preferences(dataset)
        epochs = round(self.epochs * epoch_multiplier)
        if epochs < 1:
            raise ValueError(
                f"round(epochs * epoch_multiplier) = round({self.epochs} * "
                f"{epoch_multiplier}) = {epochs}. Must train for at least one epoch.",
            )
        # A failure before an epoch's first step completes puts the generator
        # back to where the last completed step left it (before the epoch's
        # permutation and, in the first epoch, the validation split).
        rng_before_epoch = copy.deepcopy(self.rng.bit_generator.state)
        train_idx, val_idx = np.arange(len(table)), None
        if self.requires_regularizer_update:
            assert self.regularizer is not None and self.regularizer.val_split
            train_idx, val_idx = sampling.split_validation(
                self.rng,
                len(table),
                self.regularizer.val_split,
            )
        steps_per_epoch = sampling.n_batches(
            len(train_idx), self.batch_size, self.drop_last
        )
        self._task.refresh_device()
        self._gt_losses = self._task.ground_truth_losses(table)
        self._plan_memory(table)
        progress = tqdm(
            total=epochs * steps_per_epoch,
            desc="Training reward model",
            unit="step",
            disable=not self.progress_bar,
        )
        last_postfix = 0.0
        with progress, self.logger.accumulate_means("reward"):
            for epoch_num in range(epochs):
                if epoch_num:
                    rng_before_epoch = copy.deepcopy(self.rng.bit_generator.state)
                batches = sampling.epoch_batches(
                    self.rng, train_idx, self.batch_size, self.drop_last
                )
                epoch_loss_sum, epoch_items = 0.0, 0
                epoch_accuracy_sum, epoch_seconds = 0.0, 0.0
                with self.logger.add_key_prefix(f"epoch-{epoch_num}"):
                    for step_in_epoch, batch in enumerate(batches):
                        try:
                            with self.logger.add_key_prefix("train"):
                                result = self._train_step(table, batch)
                        except BaseException:
                            if step_in_epoch == 0:
                                self.rng.bit_generator.state = rng_before_epoch
                            raise
                        epoch_loss_sum += result.loss * result.n_items
                        epoch_items += result.n_items
                        epoch_accuracy_sum += (
                            result.metrics["accuracy"] * result.n_items
                        )
                        epoch_seconds += result.seconds
                        progress.update()
                        if time.perf_counter() - last_postfix > 0.5:
                            last_postfix = time.perf_counter()
                            progress.set_postfix(records.postfix(result), refresh=False)
                    if val_idx is not None:
                        train_loss = epoch_loss_sum / epoch_items
                        self._update_regularizer(table, val_idx, train_loss)
                if self.progress_bar:  # the bar's companion: a line per epoch
                    self.logger.log(
                        records.epoch_line(
                            epoch_num,
                            epochs,
                            epoch_loss_sum,
                            epoch_accuracy_sum,
                            epoch_items,
                            epoch_seconds,
                        )
                    )
            # Postfixes are throttled; the last refresh shows the last step.
            progress.set_postfix(records.postfix(result), refresh=True)
        records.record_final_values(self.logger, epoch_num)

    def _train_step(
        self,
        table: pair_table.PreferenceTable,
        batch: np.ndarray,
    ) -> StepResult:
        local = self._local_items(batch)

        def step(plan: StepPlan) -> StepResult:
            chunks = pair_chunks.make_chunks(self._task, table, local, plan)
            return self.engine.step(self._task, chunks, plan=plan, n_items=len(batch))

        plan, result = self.planner.run(
            table.lengths[local],  # per pair and side: mirrored calls
            step,
            PairWorkload.of(self._task, table, local, self.engine),
            device=self._task.device,
        )
        self.last_plan = plan
        records.record_step(
            self.logger,
            result,
            plan,
            gt_loss=records.mean_of(self._gt_losses, batch),
            profile=self.planner.profile,
            skipped_steps=self.engine.n_skipped_steps,
            # Per-epoch figures go to files and TensorBoard; the printed table
            # gets the last epoch's (``reward/final/...``) and a line per epoch.
            exclude=("stdout", "log"),
        )
        return result

    def _evaluate(
        self,
        table: pair_table.PreferenceTable,
        indices: np.ndarray,
    ) -> EvaluationResult:
        """Loss and metrics of pairs ``indices``, planned as a no-grad evaluation."""
        local = self._local_items(indices)

        def evaluate(plan: StepPlan) -> EvaluationResult:
            chunks = pair_chunks.make_chunks(self._task, table, local, plan)
            return self.engine.evaluate(
                self._task, chunks, plan=plan, n_items=len(indices)
            )

        _, result = self.planner.run(
            table.lengths[local],  # per pair and side: mirrored calls
            evaluate,
            PairWorkload.of(self._task, table, local, self.engine),
            device=self._task.device,
            evaluation=True,
        )
        return result

    def evaluate(self, dataset: data_th.Dataset) -> EvaluationResult:
        """Loss and accuracy of the reward net on ``dataset``, without training.

        Evaluation mode: norm statistics frozen, dropout off. In a process group
        each rank computes its share and the figures are those of the whole
        dataset; every rank must call this.

        Args:
            dataset: Preferences to evaluate on (a ``PreferenceDataset`` or a
                ``Subset`` of one).

        Returns:
            Mean loss, metrics (``accuracy``) and this process's per-pair losses.
        """
        table = pair_table.read_preferences(dataset)
        self._task.refresh_device()
        return self._evaluate(table, np.arange(len(table)))

    def _plan_memory(self, table: pair_table.PreferenceTable) -> None:
        """Sizes chunks from ``memory_budget``, if one is given (before training)."""
        precision.check_supported(self.autocast_dtype, self._task.device)
        if self.memory_budget is not None:
            memory_plan.fit_budget(self, table)

    def _probe(self, table: pair_table.PreferenceTable) -> probe.ActivationProfile:
        """Counts what a few reward-net calls on the first pair keep for backward."""
        return memory_plan.probe_first_pair(self, table)

    def _update_regularizer(
        self,
        table: pair_table.PreferenceTable,
        val_idx: np.ndarray,
        train_loss: float,
    ) -> None:
        assert self.regularizer is not None
        val = self._evaluate(table, val_idx)
        if not (np.isfinite(val.loss) and np.isfinite(train_loss)):
            raise FloatingPointError(
                f"non-finite loss for the lambda updater (train {train_loss}, "
                f"validation {val.loss}); regularization lambda left unchanged",
            )
        with self.logger.add_key_prefix("val"):
            self.logger.record("loss", val.loss)
            self.logger.record("accuracy", val.metrics["accuracy"])
        self.regularizer.update_params(train_loss, val.loss)
