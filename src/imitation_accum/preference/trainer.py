"""Drop-in reward trainer for imitation's preference comparisons.

One step runs ``sampler -> policy -> plan -> chunks -> engine``: each ``train()``
builds the step policy from the trainer's attributes, the batch's pairs are planned
(:mod:`~imitation_accum.planning.plan`), laid out
(:func:`~imitation_accum.preference.pair_task.make_chunks`) and stepped by the engine.
"""

import contextlib
import copy
import re
import time
from typing import Any, Dict, Hashable, List, Mapping, Optional, Tuple, Type, Union

import gymnasium as gym
import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers
from imitation.util import logger as imit_logger
from torch.utils import data as data_th
from tqdm.auto import tqdm

from imitation_accum.engine import acceleration as acceleration_options
from imitation_accum.engine import arguments as engine_arguments
from imitation_accum.engine import staging
from imitation_accum.engine.accumulator import (
    EvaluationResult,
    GradientAccumulator,
    StepResult,
    Update,
)
from imitation_accum.planning import budget, probe, threads
from imitation_accum.planning.plan import (
    StepPlan,
    StepPolicy,
    plan_evaluation,
    plan_step,
)
from imitation_accum.preference import (
    arguments,
    dataset_checks,
    pair_table,
    pair_task,
)


class CrossEntropyRewardTrainer(pc.BasicRewardTrainer):
    """Trains a reward net on preferences, accumulating gradients exactly.

    A drop-in for imitation's ``BasicRewardTrainer`` with ``CrossEntropyRewardLoss``:
    the same arguments and defaults, plus the keyword-only ones below. Every
    optimizer step equals one step on the whole batch, whatever ``minibatch_size``
    (see the exactness contract in ``docs/``); logged figures are full-batch
    figures under imitation's keys. Batches are drawn from ``rng``, a fresh
    permutation every epoch (never from torch's global RNG); the last, partial
    batch of an epoch is a plain mean over its own pairs.

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
        forward_size: Transitions per reward-net call, or ``"auto"``: derived
            from the memory probe and the device (deterministic; logged).
        drop_last: Drop each epoch's last batch if it is partial.
        max_grad_norm: Clip the gradient norm to this once per step.
        progress_bar: Show a tqdm progress bar over steps.
        optimizer_cls: The optimizer (imitation uses AdamW).
        optimizer_kwargs: Further optimizer arguments (``lr`` is passed already).
        memory_budget: Instead of ``minibatch_size``: bytes, a size such as
            ``"6GiB"``, or ``"auto"`` (a share of free device or host memory).
            Chunks are sized from a probe of the bytes autograd saves per
            transition, split inside pairs (two passes) when one pair does not
            fit; on CUDA, a step that runs out of memory is redone with chunks
            half as large. See ``docs/memory.md``.
        autocast_dtype: ``"bfloat16"`` or ``"float16"`` to run the reward net
            under ``torch.autocast`` (float16, CUDA only, with a ``GradScaler``;
            skipped steps are logged as ``amp_skipped_steps``).
        activation_checkpointing: Recompute the ``CnnRewardNet`` convolutions'
            activations in the backward (exact).
        two_pass: ``None`` runs two passes only when one pair does not fit;
            ``True``/``False`` pins the choice.
        acceleration: Accelerator options (all off by default), an
            :class:`~imitation_accum.engine.acceleration.Acceleration` or a mapping
            of its fields; see ``docs/gpu.md``.

    The settings (``batch_size``, ``minibatch_size``, ``memory_budget``,
    ``forward_size``, ``two_pass``, ``epochs``, ``lr``, ``max_grad_norm``,
    ``drop_last``, ``progress_bar``) and ``optim`` and ``logger`` may be assigned
    after construction: each ``train()`` parses and checks them
    (:class:`~imitation_accum.preference.arguments.TrainerSettings`) before any step.

    Raises:
        TypeError: naming an argument of the wrong type: a setting, ``loss`` not
            a ``CrossEntropyRewardLoss``, a preference model of an ensemble or
            overriding how it computes probabilities, ``optimizer_cls``,
            ``custom_logger`` or ``regularizer_factory``.
        ValueError: naming an argument out of range, ``minibatch_size`` and
            ``memory_budget`` given together, a budget that does not parse or
            cannot hold the parameters, gradients and optimizer state, a device
            that cannot run ``autocast_dtype``, or a key of ``optimizer_kwargs``
            that ``optimizer_cls`` refuses.

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
        arguments.check_preference_model(preference_model, ensemble=False)
        arguments.check_loss_and_rng(loss, rng)
        engine_arguments.check_logger("custom_logger", custom_logger)
        engine_arguments.check_regularizer_factory(
            "regularizer_factory", regularizer_factory
        )
        settings = arguments.TrainerSettings(
            batch_size=batch_size,
            minibatch_size=minibatch_size,
            epochs=epochs,
            lr=lr,
            forward_size=forward_size,
            drop_last=drop_last,
            max_grad_norm=max_grad_norm,
            progress_bar=progress_bar,
            memory_budget=memory_budget,
            autocast_dtype=autocast_dtype,
            activation_checkpointing=activation_checkpointing,
            two_pass=two_pass,
            acceleration=acceleration,
        )
        # Built (checking optimizer_kwargs) before imitation's constructor opens
        # a default logger's files.
        optimizer = engine_arguments.make_optimizer(
            preference_model.parameters(),
            optimizer_cls,
            optimizer_kwargs,
            defaults={"lr": settings.lr},
        )
        # imitation's BasicRewardTrainer.__init__ insists that batch_size be a
        # multiple of minibatch_size; skip it and set up the same attributes.
        pc.RewardTrainer.__init__(self, preference_model, custom_logger)
        self.loss = loss
        self.rng = rng
        self._engine: Optional[GradientAccumulator] = None
        self._set_settings(settings)
        self._checked_on: Optional[Tuple[Any, ...]] = None  # see _check_on_device
        self.regularizer = None
        self.optim = optimizer
        self.regularizer = engine_arguments.make_regularizer(
            "regularizer_factory", regularizer_factory, self.optim, self.logger
        )
        self._gt_losses: Optional[np.ndarray] = None
        self._profiles: Dict[Hashable, probe.ActivationProfile] = {}
        self._backed_off_cap: Optional[int] = None
        self._budget_message: Optional[str] = None  # logged when it changes
        self.step_policy: Optional[StepPolicy] = None
        """Built by each ``train()`` from the attributes; halved after CUDA OOM."""
        self.last_plan: Optional[StepPlan] = None
        """The plan of the last step (``forward_size``, ``two_pass``, chunks)."""
        self.memory_profile: Optional[probe.ActivationProfile] = None
        """The memory probe's profile of the net, once one was needed."""
        self._check_on_device(settings)
        self._engine = self._make_engine()
        self._engine.configure(
            autocast_dtype=settings.torch_autocast_dtype,
            activation_checkpointing=self.activation_checkpointing,
        )
        self._task = pair_task.task_for(
            preference_model,
            stager=staging.Stager() if self.acceleration.pinned_staging else None,
            call_target=None if self._engine is None else self._engine.forward_module,
        )

    # imitation reads and assigns these; the engine and regularizer follow.
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
        """The optimizer (imitation's attribute); the engine steps this one."""
        return self._optim

    @optim.setter
    def optim(self, optimizer: th.optim.Optimizer) -> None:
        if not isinstance(optimizer, th.optim.Optimizer):
            raise TypeError(
                "optim must be a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}",
            )
        self._optim = optimizer
        if self.regularizer is not None:
            self.regularizer.optimizer = optimizer

    @property
    def lr(self) -> float:
        """The optimizer's learning rate (of its first parameter group)."""
        return float(self.optim.param_groups[0]["lr"])

    @lr.setter
    def lr(self, value: float) -> None:
        for group in self.optim.param_groups:  # checked by the next train()
            group["lr"] = value

    def _set_settings(self, settings: arguments.TrainerSettings) -> None:
        """Sets the attributes a ``train()`` reads to ``settings``' parsed values."""
        self.batch_size = settings.batch_size
        # imitation's attribute is an int; None here is the whole batch.
        self.minibatch_size = settings.minibatch_size  # type: ignore[assignment]
        self.memory_budget = settings.memory_budget
        self.epochs = settings.epochs
        self.forward_size = settings.forward_size
        self.two_pass = settings.two_pass
        self.drop_last = settings.drop_last
        self.progress_bar = settings.progress_bar
        self.max_grad_norm = settings.max_grad_norm
        self.autocast_dtype = settings.autocast_dtype
        self.activation_checkpointing = settings.activation_checkpointing
        self.acceleration = settings.acceleration

    def _check_on_device(self, settings: arguments.TrainerSettings) -> None:
        """The checks that need the net, its device and optimizer, once per change.

        Raises:
            ValueError: naming ``autocast_dtype``, ``memory_budget`` (too large for
                the device, or too small for the training state),
                ``activation_checkpointing`` or an ``acceleration`` option.
        """
        net = self._preference_model.model
        checked_on = (settings, net.device, self.optim)
        if checked_on == self._checked_on:
            return
        settings.check_device(net.device)
        if settings.activation_checkpointing:
            acceleration_options.check_checkpointable(net)
        budget.check_holds_training_state(settings.memory_budget, self.optim)
        settings.acceleration.check_net(net, settings.activation_checkpointing)
        self._checked_on = checked_on

    def train(
        self, dataset: pc.PreferenceDataset, epoch_multiplier: float = 1.0
    ) -> None:
        """Trains as imitation's ``train`` does, with the ``acceleration`` options.

        Raises:
            ValueError: before any step, naming by index the pairs of ``dataset``
                that do not fit the reward net's spaces (see
                :func:`~imitation_accum.preference.dataset_checks.check_dataset`).
        """
        self._check_dataset(dataset)
        with self.acceleration.applied(self._preference_model.model):
            super().train(dataset, epoch_multiplier)

    def _check_dataset(self, dataset: data_th.Dataset) -> None:
        """Checks every pair of ``dataset`` against the reward net's spaces."""
        net = self._preference_model.model
        actions = net.action_space
        if isinstance(actions, gym.spaces.Box):
            # Finite actions; a Box's bounds are not the reward's concern (nor
            # are the observation space's).
            dtype: Any = actions.dtype  # a Box's own, which gym's stubs do not type
            actions = gym.spaces.Box(-np.inf, np.inf, actions.shape, dtype)
        dataset_checks.check_dataset(
            dataset,
            net.observation_space,
            actions,
            environment="the reward net's spaces",
        )

    def _make_engine(self) -> GradientAccumulator:
        """The accumulation engine for this trainer's reward net (a hook)."""
        return GradientAccumulator(self._preference_model.model)

    def _local_items(self, indices: np.ndarray) -> np.ndarray:
        """The share of ``indices`` this process computes (a hook: all of them)."""
        return indices

    @property
    def engine(self) -> GradientAccumulator:
        """The accumulation engine stepping this trainer's reward net."""
        assert self._engine is not None
        return self._engine

    def _train(self, dataset: data_th.Dataset, epoch_multiplier: float = 1.0) -> None:
        """Trains for ``round(epochs * epoch_multiplier)`` epochs over ``dataset``."""
        table = pair_table.read_preferences(dataset)
        self._check_settings()
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
            train_idx, val_idx = _split_validation(
                self.rng, len(table), self.regularizer.val_split
            )
        steps_per_epoch = _n_batches(len(train_idx), self.batch_size, self.drop_last)
        self._task.refresh_device()
        self._gt_losses = self._task.ground_truth_losses(table)
        self.step_policy = self._step_policy(table)
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
                batches = _epoch_batches(
                    self.rng, train_idx, self.batch_size, self.drop_last
                )
                loss_sum = accuracy_sum = seconds = 0.0
                n_pairs = 0
                with self.logger.add_key_prefix(f"epoch-{epoch_num}"):
                    for step_in_epoch, batch in enumerate(batches):
                        try:
                            with self.logger.add_key_prefix("train"):
                                result = self._train_step(table, batch)
                        except BaseException:
                            if step_in_epoch == 0:
                                self.rng.bit_generator.state = rng_before_epoch
                            raise
                        loss_sum += result.loss * result.n_items
                        accuracy_sum += result.metrics["accuracy"] * result.n_items
                        n_pairs += result.n_items
                        seconds += result.seconds
                        progress.update()
                        if time.perf_counter() - last_postfix > 0.5:
                            last_postfix = time.perf_counter()
                            progress.set_postfix(_postfix(result), refresh=False)
                    if val_idx is not None:
                        self._update_regularizer(table, val_idx, loss_sum / n_pairs)
            # Postfixes are throttled; the last refresh shows the last step.
            progress.set_postfix(_postfix(result), refresh=True)
        if self.progress_bar:  # the bar's companion: one line per train()
            rate = n_pairs / seconds if seconds > 0 else float("inf")
            self.logger.log(
                f"reward model, {epochs} epoch{'s' * (epochs > 1)} of "
                f"{steps_per_epoch} step{'s' * (steps_per_epoch != 1)}: last epoch "
                f"loss {loss_sum / n_pairs:.4f}, "
                f"accuracy {accuracy_sum / n_pairs:.3f}, {rate:.0f} pairs/s"
            )
        _record_final_values(self.logger, epoch_num)

    def _check_settings(self) -> None:
        """Parses and checks the attributes a ``train()`` reads, as the constructor."""
        settings = arguments.TrainerSettings(
            batch_size=self.batch_size,
            minibatch_size=self.minibatch_size,
            epochs=self.epochs,
            lr=self.lr,
            forward_size=self.forward_size,
            drop_last=self.drop_last,
            max_grad_norm=self.max_grad_norm,
            progress_bar=self.progress_bar,
            memory_budget=self.memory_budget,
            autocast_dtype=self.autocast_dtype,
            activation_checkpointing=self.activation_checkpointing,
            two_pass=self.two_pass,
            acceleration=self.acceleration,
        )
        self._check_on_device(settings)
        self._set_settings(settings)  # an assigned "6GiB" reaches the planner as bytes

    def _step_policy(self, table: pair_table.PreferenceTable) -> StepPolicy:
        """This ``train()``'s step policy, from the attributes and the memory probe."""
        device = self._task.device
        forward_size: Optional[int] = None
        cap = None
        if self.forward_size != "auto":
            forward_size = int(self.forward_size)
        profile = None
        if self.memory_budget is not None or self.forward_size == "auto":
            profile = self._profile(table)
            if self.forward_size == "auto":
                forward_size = self._agreed_forward_size(profile.forward_size())
            if self.memory_budget is not None:
                cap = self._fit_budget(table, profile)
        # On a CPU the calls' threads follow their size, unless the user chose them.
        # A compiled forward is not probed for them alone (the probe's calls would
        # compile shapes of their own); a probe out of memory leaves the caller's
        # threads (the steps back off on their own).
        thread_policy = None
        if device.type == "cpu" and threads.explicit_choice() is None:
            if profile is None and not self.acceleration.compile:
                with contextlib.suppress(th.OutOfMemoryError):
                    profile = self._profile(table)
            if profile is not None:
                thread_policy = threads.ThreadPolicy.of(profile)
        caps = [c for c in (cap, self._backed_off_cap) if c is not None]
        return StepPolicy(
            minibatch_size=self.minibatch_size,
            chunk_cap=min(caps) if caps else None,
            forward_size=forward_size,
            two_pass=self.two_pass,
            threads=thread_policy,
        )

    def _agreed_forward_size(self, size: Optional[int]) -> Optional[int]:
        """The default forward size every process uses (a hook: this one's)."""
        return size

    def _profile(self, table: pair_table.PreferenceTable) -> probe.ActivationProfile:
        """What a few reward-net calls on the first pair keep for backward; cached."""
        frame = table.first_obs()
        engine = self.engine
        key = (
            frame.shape[1:],
            str(frame.dtype),
            str(self._task.device),
            engine.autocast_dtype,
            bool(engine.checkpointed),
            id(self.optim),  # its state is part of the fixed bytes
        )
        if key not in self._profiles:
            layout = table.layout(np.arange(1))
            net = self._task.net

            def call(start: int, stop: int) -> th.Tensor:
                return self._task.call(layout, start, stop, module=net)

            self._profiles[key] = probe.profile_calls(
                call,
                layout.n_transitions,
                measuring=lambda ckpt: engine.measuring(checkpointing=ckpt),
                params=list(net.parameters()),
                device=self._task.device,
                fixed_bytes=budget.training_state_bytes(self.optim),
                # obs and next_obs converted to float32 on the device.
                input_bytes_per_transition=2 * 4 * int(np.prod(frame.shape[1:])),
                checkpointed=self.activation_checkpointing,
            )
        self.memory_profile = self._profiles[key]
        return self.memory_profile

    def _fit_budget(
        self,
        table: pair_table.PreferenceTable,
        profile: probe.ActivationProfile,
    ) -> int:
        """The transitions per chunk ``memory_budget`` holds (logged; raises if 0)."""
        assert self.memory_budget is not None
        pair_lengths = table.lengths.sum(1)
        largest_batch = int(np.sort(pair_lengths)[-self.batch_size :].sum())
        cap, message = probe.fit_budget(
            self.memory_budget,
            profile,
            device=self._task.device,
            resident_bytes=budget.resident_training_bytes(self.optim),
            largest_batch=largest_batch,
            item=int(pair_lengths.max()),
        )
        if message != self._budget_message:
            self.logger.log(message)
            self._budget_message = message
        return cap

    def _run(
        self,
        table: pair_table.PreferenceTable,
        indices: np.ndarray,
        *,
        evaluation: bool,
    ) -> Any:
        """Plans and runs a step (or an evaluation) of pairs ``indices``.

        A step out of memory leaves no trace (the engine rolls back); it is planned
        again with chunks half as large and redone. The plan's intra-op threads
        hold while it runs; the caller's come back afterwards.
        """
        local = self._local_items(indices)
        lengths = table.lengths[local]  # per pair and side: mirrored calls
        policy = started = self.step_policy
        assert policy is not None and started is not None  # built by train()
        update = Update(self.optim, self.regularizer, self.max_grad_norm)
        while True:
            plan = (plan_evaluation if evaluation else plan_step)(lengths, policy)
            try:
                with threads.intra_op(plan.threads):
                    chunks = pair_task.make_chunks(self._task, table, local, plan)
                    result: Any = (
                        self.engine.evaluate(self._task, chunks, n_items=len(indices))
                        if evaluation
                        else self.engine.step(
                            self._task,
                            chunks,
                            plan=plan,
                            n_items=len(indices),
                            update=update,
                        )
                    )
                break
            except th.OutOfMemoryError as error:
                policy = policy.backed_off(plan, error)
            # Outside the handler: the error's frames (and tensors) are gone.
            if self._task.device.type == "cuda":
                th.cuda.empty_cache()
            self.logger.log(
                "out of memory: step redone with chunks of at most "
                f"{policy.chunk_cap} {policy.unit}s"
            )
        if policy.chunk_cap != started.chunk_cap:
            # An out-of-memory back-off holds for later train() calls too.
            self._backed_off_cap = policy.chunk_cap
        self.step_policy, self.last_plan = policy, plan
        return result

    def _train_step(
        self,
        table: pair_table.PreferenceTable,
        batch: np.ndarray,
    ) -> StepResult:
        result = self._run(table, batch, evaluation=False)
        plan = self.last_plan
        assert plan is not None

        def record(key: str, value: float) -> None:
            # Per-epoch figures go to files and TensorBoard; the printed table
            # gets the last epoch's (``reward/final/...``) and a line per epoch.
            self.logger.record(key, value, ("stdout", "log"))

        record("loss", result.loss)
        record("accuracy", result.metrics["accuracy"])
        if self._gt_losses is not None:
            gt_loss = self._gt_losses[batch].mean(dtype=np.float64)
            record("gt_reward_loss", float(gt_loss))
        record("grad_norm", result.grad_norm)
        record("pairs_per_second", result.n_items / result.seconds)
        record("chunks_per_step", result.n_chunks)
        record("peak_memory_mib", result.peak_memory_bytes / 2**20)
        record("forward_size", plan.forward_size)
        record("intra_op_threads", plan.threads or th.get_num_threads())
        record("two_pass", float(result.two_pass))
        record("chunk_transitions", plan.largest_chunk)
        profile = self.memory_profile
        if self.memory_budget is not None and profile and plan.largest_chunk:
            estimate = profile.chunk_bytes(plan.largest_chunk, plan.forward_size)
            record("memory_estimate_mib", estimate / 2**20)
        if result.loss_scale is not None:
            record("amp_loss_scale", result.loss_scale)
            record("amp_skipped_steps", self.engine.n_skipped_steps)
        return result

    def evaluate(self, dataset: data_th.Dataset) -> EvaluationResult:
        """Loss and accuracy of the reward net on ``dataset``, without training.

        Evaluation mode: norm statistics frozen, dropout off. In a process group
        the figures are those of the whole dataset; every rank must call this.

        Args:
            dataset: Preferences to evaluate on (a ``PreferenceDataset`` or a
                ``Subset`` of one).

        Returns:
            Mean loss, metrics (``accuracy``) and this process's per-pair losses.

        Raises:
            ValueError: naming the pairs that do not fit the reward net's spaces.
        """
        self._check_dataset(dataset)
        table = pair_table.read_preferences(dataset)
        self._check_settings()
        self._task.refresh_device()
        self.step_policy = self._step_policy(table)
        return self._run(table, np.arange(len(table)), evaluation=True)

    def _update_regularizer(
        self,
        table: pair_table.PreferenceTable,
        val_idx: np.ndarray,
        train_loss: float,
    ) -> None:
        assert self.regularizer is not None
        val = self._run(table, val_idx, evaluation=True)
        if not (np.isfinite(val.loss) and np.isfinite(train_loss)):
            raise FloatingPointError(
                f"non-finite loss for the lambda updater (train {train_loss}, "
                f"validation {val.loss}); regularization lambda left unchanged",
            )
        with self.logger.add_key_prefix("val"):
            self.logger.record("loss", val.loss)
            self.logger.record("accuracy", val.metrics["accuracy"])
        self.regularizer.update_params(train_loss, val.loss)


def _epoch_batches(
    rng: np.random.Generator,
    indices: np.ndarray,
    batch_size: int,
    drop_last: bool,
) -> List[np.ndarray]:
    """One epoch's batches over ``indices``, freshly shuffled."""
    order = rng.permutation(indices)
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def _n_batches(n_items: int, batch_size: int, drop_last: bool) -> int:
    steps = n_items // batch_size
    if not drop_last and n_items % batch_size:
        steps += 1
    if steps == 0:
        raise ValueError(
            f"drop_last=True with {n_items} training comparisons and "
            f"batch_size={batch_size}: no batch to train on",
        )
    return steps


def _split_validation(
    rng: np.random.Generator,
    n_items: int,
    val_fraction: float,
) -> Tuple[np.ndarray, np.ndarray]:
    """``(train_indices, val_indices)``: ``int(n_items * val_fraction)`` held out."""
    n_val = int(n_items * val_fraction)
    if n_val < 1 or n_items - n_val < 1:
        # imitation's message first: code that matches on it keeps working.
        raise ValueError(
            "Not enough data samples to split into training and validation: "
            f"cannot split {n_items} comparisons with val_split={val_fraction}: "
            "both the training and the validation part need at least one "
            "comparison. Gather more preferences (initial_comparison_frac in "
            "PreferenceComparisons) or change the regularizer's val_split.",
        )
    order = rng.permutation(n_items)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def _record_final_values(
    logger: imit_logger.HierarchicalLogger, epoch_num: int
) -> None:
    """Records the last epoch's means again under ``reward/final/``.

    imitation's ``BasicRewardTrainer._train`` does so, with no hook for it.
    """
    outer_prefix = logger.get_accumulate_prefixes()
    base_path = f"{outer_prefix}reward/"
    pattern = re.compile(rf"mean/{re.escape(base_path)}epoch-{epoch_num}/(.+)")
    for key in list(logger.name_to_value.keys()):
        if match := pattern.fullmatch(key):
            value = logger.name_to_value[key]
            logger.record(f"{base_path}final/{match.group(1)}", value)


def _postfix(result: StepResult) -> Mapping[str, str]:
    return {
        "loss": f"{result.loss:.4f}",
        "acc": f"{result.metrics['accuracy']:.3f}",
        "pairs/s": f"{result.n_items / result.seconds:.1f}",
        "peak": f"{result.peak_memory_bytes / 2**20:.0f}MiB",
    }
