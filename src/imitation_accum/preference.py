"""Drop-in reward trainers for imitation's preference comparisons.

:class:`CrossEntropyRewardTrainer` replaces imitation's ``BasicRewardTrainer`` with
``CrossEntropyRewardLoss`` (same constructor arguments and defaults) and
:class:`EnsembleTrainer` replaces its ``EnsembleTrainer``. Any ``minibatch_size``
gives the full-batch update: see the package's exactness contract.
"""

import contextlib
import re
import time
from typing import (
    Any,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
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
    memory,
    planning,
    precision,
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
        self.memory_budget = memory.parse_budget(memory_budget)
        if self.memory_budget is not None and self.minibatch_size is not None:
            raise ValueError(
                f"minibatch_size={minibatch_size!r} and memory_budget="
                f"{memory_budget!r} are alternatives: give one of them",
            )
        self.autocast_dtype = precision.parse_autocast_dtype(autocast_dtype)
        if not isinstance(activation_checkpointing, bool):
            raise ValueError(
                "activation_checkpointing must be a bool, got "
                f"{activation_checkpointing!r}",
            )
        self.activation_checkpointing = activation_checkpointing
        if two_pass is not None and not isinstance(two_pass, bool):
            raise ValueError(f"two_pass must be None or a bool, got {two_pass!r}")
        self.two_pass = two_pass
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
        self._gt_losses: Optional[np.ndarray] = None
        self._forward_sizes: Dict[int, int] = {}
        self.planner = planning.ChunkPlanner(
            minibatch_size=self.minibatch_size,
            forward_size=self.forward_size,
            two_pass=two_pass,
        )
        self.memory_profile: Optional[memory.ActivationProfile] = None
        self._profile_key: Optional[Tuple[Any, ...]] = None
        self._backed_off_cap: Optional[int] = None
        self._engine: Optional[accumulation.GradientAccumulator] = None
        if not self._for_ensembles:
            self._check_memory_options()
            self._engine = self._make_engine()
            self._engine.configure(
                autocast_dtype=self.autocast_dtype,
                activation_checkpointing=activation_checkpointing,
            )

    def _check_memory_options(self) -> None:
        """Checks the budget and precision against the net (before training)."""
        net = self._preference_model.model
        precision.check_supported(self.autocast_dtype, net.device)
        if self.activation_checkpointing:
            memory.check_checkpointable(net)
        if isinstance(self.memory_budget, int):
            needed = memory.training_state_bytes(self.optim)
            if self.memory_budget < needed:
                raise ValueError(
                    f"memory_budget={memory.format_bytes(self.memory_budget)} is "
                    f"smaller than the {memory.format_bytes(needed)} that the "
                    "parameters, their gradients and the optimizer state need",
                )

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
        local = self._local_items(batch)
        lengths = table.lengths[local].sum(1)
        while True:
            plan = self._plan(table, local, lengths)
            chunks = self._chunks_of(plan, table, local)
            forward_size = plan.forward_size
            self._task.forward_size = forward_size
            self._task.two_pass = plan.two_pass
            net_calls = (
                len(chunks)
                if plan.two_pass
                else sum(
                    planning.n_calls(c.layout.n_transitions, forward_size)
                    for c in chunks
                )
            )
            try:
                result = self.engine.step(
                    self._task,
                    chunks,
                    n_items=len(batch),
                    net_calls=net_calls,
                )
            except th.OutOfMemoryError as error:
                # The engine has undone the partial step; redo it with chunks
                # half as large (raises at one transition).
                cap = self.planner.back_off(plan, lengths, error)
            else:
                break
            del chunks
            self._backed_off_cap = cap
            memory.release_cached_memory(self._task.device)
            self.logger.log(
                f"out of memory: step redone with chunks of at most {cap} transitions",
            )
        self.logger.record("loss", result.loss)
        self.logger.record("accuracy", result.metrics["accuracy"])
        if self._gt_losses is not None:
            gt_loss = float(self._gt_losses[batch].mean(dtype=np.float64))
            self.logger.record("gt_reward_loss", gt_loss)
        self.logger.record("grad_norm", result.grad_norm)
        self.logger.record("pairs_per_second", result.n_items / result.seconds)
        self.logger.record("minibatches_per_step", result.n_minibatches)
        self.logger.record("peak_memory_mib", result.peak_memory_bytes / 2**20)
        self.logger.record("forward_size", forward_size)
        self.logger.record("two_pass", float(result.two_pass))
        largest = (
            plan.largest_chunk(lengths)
            if plan.two_pass
            else max((c.layout.n_transitions for c in chunks), default=0)
        )
        self.logger.record("chunk_transitions", largest)
        if self.memory_profile is not None and largest:
            estimate = self.memory_profile.chunk_bytes(largest, forward_size)
            self.logger.record("memory_estimate_mib", estimate / 2**20)
        if result.loss_scale is not None:
            self.logger.record("amp_loss_scale", result.loss_scale)
            self.logger.record("amp_skipped_steps", self.engine.n_skipped_steps)
        return result

    def _plan(
        self,
        table: preference_data.PreferenceTable,
        local: np.ndarray,
        lengths: np.ndarray,
    ) -> planning.StepPlan:
        """The planner's decision for a batch (tuning and timing on first use)."""

        def tune(max_size: int) -> int:
            cap = self.planner.max_transitions
            limit = max_size if cap is None else min(max_size, cap)
            if self.forward_size != "auto":
                return min(int(self.forward_size), limit)
            if limit not in self._forward_sizes:  # tuned once per call limit
                sample = self._sample(table, local, max_size)
                self._forward_sizes[limit] = self._forward_size_for(sample)
            return min(self._forward_sizes[limit], max_size)

        def time_passes(items: slice, size: int) -> Tuple[float, float]:
            chunk = self._task.make_chunk(table, local[items])
            with self._measuring(), self._calling_the_net():
                timed = planning.time_passes(
                    lambda start, stop: self._task.call(chunk.layout, start, stop),
                    chunk.layout.n_transitions,
                    size,
                    list(self._task.net.parameters()),
                    self._task.device,
                )
            self.logger.log(
                f"two_pass: {timed[1]:.3g} s vs one pass {timed[0]:.3g} s over "
                f"{chunk.layout.n_transitions} transitions in calls of {size}: "
                f"{'two passes' if timed[1] <= timed[0] else 'one pass'}",
            )
            return timed

        return self.planner.plan(
            lengths,
            tune_forward_size=tune,
            time_passes=time_passes,
        )

    def _sample(
        self,
        table: preference_data.PreferenceTable,
        local: np.ndarray,
        n_transitions: int,
    ) -> preference_task.PairChunk:
        """The first pairs of ``local`` holding at least ``n_transitions``."""
        lengths = np.cumsum(table.lengths[local].sum(1))
        n_pairs = min(len(local), int(np.searchsorted(lengths, n_transitions)) + 1)
        return self._task.make_chunk(table, local[:n_pairs])

    def _chunks_of(
        self,
        plan: planning.StepPlan,
        table: preference_data.PreferenceTable,
        local: np.ndarray,
    ) -> List[Any]:
        if not len(local):
            return []
        if plan.two_pass:
            batch = self._task.make_chunk(table, local)
            return list(preference_task.transition_chunks(batch, plan.forward_size))
        return [self._task.make_chunk(table, local[s]) for s in plan.item_chunks]

    def _make_chunks(
        self,
        table: preference_data.PreferenceTable,
        indices: np.ndarray,
    ) -> List[preference_task.PairChunk]:
        lengths = table.lengths[indices].sum(1)
        return [
            self._task.make_chunk(table, indices[s])
            for s in planning.pair_chunks(
                lengths,
                max_items=self.minibatch_size,
                max_transitions=self.planner.max_transitions,
            )
        ]

    def _measuring(self, *, checkpointing: bool = True) -> contextlib.ExitStack:
        """Context of timing and probing calls.

        They leave no trace on the RNG or norm statistics, and run as a step's
        forwards run (autocast, and activation checkpointing unless
        ``checkpointing=False``).
        """
        stack = contextlib.ExitStack()
        stack.enter_context(accumulation.forked_rng(self._task.device))
        stack.enter_context(self.engine.norms.frozen())
        stack.enter_context(self.engine.forward_context(grad=checkpointing))
        return stack

    def _forward_size_for(self, chunk: preference_task.PairChunk) -> int:
        """Transitions per reward-net call for chunks like ``chunk``.

        At most the chunk's transitions, and at most the planner's memory cap.
        """
        limit = chunk.layout.n_transitions
        cap = self.planner.max_transitions
        if cap is not None:
            limit = min(limit, cap)
        if self.forward_size != "auto":
            return min(int(self.forward_size), limit)
        if limit not in self._forward_sizes:
            self._forward_sizes[limit] = self._tune_forward_size(chunk, limit)
        return self._forward_sizes[limit]

    def _tune_forward_size(
        self,
        chunk: preference_task.PairChunk,
        max_size: Optional[int] = None,
    ) -> int:
        net = self._task.net
        device = self._task.device
        frame = types.assert_not_dictobs(chunk.layout.fragments[0].obs)
        key = planning.architecture_key(
            net,
            frame.shape[1:],
            frame.dtype,
            str(device),
            self.autocast_dtype,
            self.activation_checkpointing,
        )
        params: List[th.Tensor] = list(net.parameters())

        limit = max_size or chunk.layout.n_transitions

        def time_per_transition(size: int) -> float:
            # As a one-pass chunk runs: calls of ``size`` over a stretch of
            # transitions, their graphs kept, then one backward.
            total = min(limit, max(size, planning.TUNING_TRANSITIONS))

            def run() -> th.Tensor:
                return th.cat(
                    [
                        self._task.call(chunk.layout, s, min(s + size, total))
                        for s in range(0, total, size)
                    ],
                )

            with self._measuring():
                seconds = planning.time_forward_backward(run, params, device)
            return seconds / total

        size = planning.tuned_forward_size(key, limit, time_per_transition)
        self.logger.log(f"forward_size: {size} transitions per reward-net call")
        return size

    def _plan_memory(self, table: preference_data.PreferenceTable) -> None:
        """Sizes chunks from ``memory_budget`` (a probe on the first pair).

        Raises:
            ValueError: if not even one transition fits in the budget.
        """
        device = self._task.device
        precision.check_supported(self.autocast_dtype, device)  # the net may move
        if self.memory_budget is None:
            self.planner.max_transitions = self._backed_off_cap
            return
        frame = types.assert_not_dictobs(table.pairs[0][0].obs)
        key = (frame.shape[1:], frame.dtype, str(device))
        if self.memory_profile is None or self._profile_key != key:
            self.memory_profile = self._probe(table)
            self._profile_key = key
        profile = self.memory_profile
        budget = memory.resolve_budget(
            self.memory_budget,
            device,
            memory.resident_training_bytes(self.optim),
        )
        largest_batch = int(np.sort(table.lengths.sum(1))[-self.batch_size :].sum())
        cap = profile.max_chunk_transitions(budget, largest_batch)
        if cap == 0:
            raise ValueError(
                f"memory_budget={self.memory_budget!r} ({memory.format_bytes(budget)}"
                f") is too small: one transition needs an estimated "
                f"{memory.format_bytes(profile.chunk_bytes(1, 1))} ("
                f"{profile.describe()})",
            )
        if self._backed_off_cap is not None:
            cap = min(cap, self._backed_off_cap)
        self.planner.max_transitions = cap
        pair = int(table.lengths.sum(1).max())
        self.logger.log(
            f"memory_budget: {memory.format_bytes(budget)}; probe: "
            f"{profile.describe()}; chunks of at most {cap} transitions ("
            + (
                f"{cap // pair} pairs"
                if cap >= pair
                else f"less than a pair of {pair}: two passes"
            )
            + f"); a whole batch in one chunk would need "
            f"{memory.format_bytes(profile.chunk_bytes(largest_batch, largest_batch))}",
        )

    def _probe(
        self,
        table: preference_data.PreferenceTable,
    ) -> memory.ActivationProfile:
        """Counts what a few reward-net calls on the first pair keep for backward."""
        sample = self._task.make_chunk(table, np.arange(1))
        net = self._task.net
        frame = types.assert_not_dictobs(sample.layout.fragments[0].obs)
        # obs and next_obs converted to float32 on the device, per transition.
        input_bytes = 2 * 4 * int(np.prod(frame.shape[1:]))

        def run(n: int) -> th.Tensor:
            with self._measuring():
                return self._task.call(sample.layout, 0, n)

        def run_plain(n: int) -> th.Tensor:
            with self._measuring(checkpointing=False):
                return self._task.call(sample.layout, 0, n)

        with self._calling_the_net():
            return memory.profile_activations(
                run,
                max_transitions=sample.layout.n_transitions,
                params=list(net.parameters()),
                device=self._task.device,
                fixed_bytes=memory.training_state_bytes(self.optim),
                input_bytes_per_transition=input_bytes,
                run_without_checkpointing=(
                    run_plain if self.activation_checkpointing else None
                ),
            )

    @contextlib.contextmanager
    def _calling_the_net(self) -> Iterator[None]:
        """Calls go to the net itself, not through a wrapper such as DDP's.

        Probes and timings differentiate with ``torch.autograd.grad``; a DDP
        wrapper must see only the real steps' forwards and backwards.
        """
        through = self._task.call_target
        self._task.call_target = self._task.net
        try:
            yield
        finally:
            self._task.call_target = through

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
        self._task.two_pass = False
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
