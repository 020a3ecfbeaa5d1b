"""Drop-in AIRL and GAIL whose discriminator accumulates gradients exactly.

The generator (``train_gen``) is imitation's.
"""

import contextlib
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np
import torch as th
from imitation.algorithms import base
from imitation.algorithms.adversarial import airl as imitation_airl
from imitation.algorithms.adversarial import common
from imitation.algorithms.adversarial import gail as imitation_gail
from imitation.data import types
from imitation.rewards import reward_nets
from imitation.util import networks
from stable_baselines3.common import base_class, vec_env

from imitation_accum.adversarial import discriminator_task
from imitation_accum.adversarial.arguments import (
    DiscriminatorSettings,
    check_arguments,
)
from imitation_accum.engine import acceleration as acceleration_options
from imitation_accum.engine import staging
from imitation_accum.engine.accumulator import GradientAccumulator, StepResult, Update
from imitation_accum.planning import budget, probe, threads
from imitation_accum.planning.plan import StepPolicy, plan_step

_ROW = "row (an expert and a generator transition)"


class AccumulatingAdversarialTrainer(common.AdversarialTrainer):
    """imitation's adversarial trainer with an accumulated discriminator update.

    The base of :class:`AIRL` and :class:`GAIL`. A discriminator step splits its
    expert and generator transitions into minibatches of any size; the update and
    every statistic are the whole batch's.

    Args:
        demonstrations: Expert demonstrations, as in imitation.
        demo_batch_size: Expert transitions per discriminator step.
        venv: The vectorized environment.
        gen_algo: The generator (AIRL: a stochastic SB3 policy, such as PPO's).
        reward_net: The discriminator's reward net (AIRL: usually shaped).
        demo_minibatch_size: Expert (and as many generator) transitions per
            forward/backward, any value in ``[1, demo_batch_size]``; ``None``
            means the whole batch. Every size gives the full-batch update.
        minibatch_size: Alias of ``demo_minibatch_size``.
        max_grad_norm: Clip the discriminator's gradient norm to this, once a step.
        memory_budget: Instead of ``demo_minibatch_size``: bytes, ``"6GiB"`` or
            ``"auto"``, which a probe at the first step sizes minibatches to fit;
            on CUDA a step out of memory anyway is redone with half-size ones.
        acceleration: Accelerator options for the discriminator (see
            ``docs/gpu.md``): an ``Acceleration`` or a mapping of its fields.
        **kwargs: imitation's further ``AdversarialTrainer`` arguments
            (``n_disc_updates_per_round``, ``disc_opt_cls``, ...).

    ``demo_minibatch_size``, ``max_grad_norm``, ``memory_budget`` and
    ``acceleration`` may be assigned after construction: each ``train_disc()``
    reads and checks them.

    Raises:
        TypeError: naming an argument of the wrong type (see
            :func:`~imitation_accum.adversarial.arguments.check_arguments`; a bool
            argument such as ``allow_variable_horizon`` given another value).
        ValueError: naming an argument out of range, a ``memory_budget`` smaller
            than the discriminator's training state, or a batch-norm layer in the
            reward net (not accumulable exactly).
    """

    #: Inside :meth:`train`: the acceleration holds from a round's first
    #: discriminator step until the generator trains or the callback runs.
    _in_train: bool = False
    _held_acceleration: Optional[contextlib.ExitStack] = None

    def __init__(
        self,
        *,
        demonstrations: base.AnyTransitions,
        demo_batch_size: int,
        venv: vec_env.VecEnv,
        gen_algo: base_class.BaseAlgorithm,
        reward_net: reward_nets.RewardNet,
        demo_minibatch_size: Optional[int] = None,
        minibatch_size: Optional[int] = None,
        max_grad_norm: Optional[float] = None,
        memory_budget: Optional[Any] = None,
        acceleration: acceleration_options.AccelerationArg = None,
        **kwargs: Any,
    ) -> None:
        settings, flags = check_arguments(
            {
                "demo_batch_size": demo_batch_size,
                "demo_minibatch_size": demo_minibatch_size,
                "minibatch_size": minibatch_size,
                "max_grad_norm": max_grad_norm,
                "memory_budget": memory_budget,
                "acceleration": acceleration,
                **kwargs,
            },
        )
        # imitation rejects a demo_minibatch_size that does not divide
        # demo_batch_size; any size is exact here, so it is set below.
        super().__init__(
            demonstrations=demonstrations,
            demo_batch_size=settings.demo_batch_size,
            venv=venv,
            gen_algo=gen_algo,
            reward_net=reward_net,
            demo_minibatch_size=None,
            **{**kwargs, **flags},
        )
        self.last_disc_result: Optional[StepResult] = None
        self.engine = GradientAccumulator[discriminator_task.DiscriminatorChunk](
            self._reward_net
        )
        """The accumulation engine stepping the discriminator."""
        self.step_policy: Optional[StepPolicy] = None
        """The step policy the last discriminator step ran with."""
        self.memory_profile: Optional[probe.ActivationProfile] = None
        """The memory probe's profile of the discriminator (with a budget, or on a
        CPU for the intra-op threads)."""
        self._budget_cap: Optional[int] = None
        self._checked_on: Optional[Tuple[Any, ...]] = None
        self._use_settings(settings)

    def _use_settings(self, settings: DiscriminatorSettings) -> None:
        """Sets the attributes a step reads to ``settings``' parsed values.

        Runs the checks that need the discriminator's device and optimizer when
        the settings or those change; a changed budget is fitted afresh.

        Raises:
            ValueError: naming ``memory_budget``, too large for the device or too
                small for the discriminator's training state, or an
                ``acceleration`` option the reward net does not allow.
        """
        device = self._reward_net.device
        checked_on = (settings, device, self._disc_opt)
        if checked_on != self._checked_on:
            settings.acceleration.check_net(self._reward_net)
            settings.check_device(device)
            budget.check_holds_training_state(
                settings.memory_budget,
                self._disc_opt,
                "the discriminator's parameters, gradients and optimizer state",
                f"{settings.key_prefix}memory_budget",
            )
            fitted = self._checked_on[0] if self._checked_on else settings
            if settings.memory_budget != fitted.memory_budget:
                self._budget_cap, self.step_policy = None, None  # fitted afresh
            self._checked_on = checked_on
        self.demo_minibatch_size = settings.demo_minibatch_size or self.demo_batch_size
        self.memory_budget = settings.memory_budget
        self.max_grad_norm = settings.max_grad_norm
        self.acceleration = settings.acceleration

    def _profile(
        self,
        task: discriminator_task.DiscriminatorTask,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
    ) -> probe.ActivationProfile:
        """The memory probe on a few rows (once: cached in ``memory_profile``)."""
        if self.memory_profile is not None:
            return self.memory_profile

        def call(start: int, stop: int) -> th.Tensor:
            rows = [slice(0, stop - start)]
            some_expert = {key: value[start:stop] for key, value in expert.items()}
            some_generated = {k: value[start:stop] for k, value in generated.items()}
            log_probs = self._policy_log_probs(some_expert, some_generated, rows)
            (chunk,) = task.chunks(some_expert, some_generated, rows, log_probs)
            return task.forward(chunk)

        obs_size = int(np.prod(self.venv.observation_space.shape or ()))
        profile = probe.profile_calls(
            call,
            min(4, self.demo_batch_size),
            measuring=lambda ckpt: self.engine.measuring(checkpointing=ckpt),
            params=list(self._reward_net.parameters()),
            device=task.device,
            fixed_bytes=budget.training_state_bytes(self._disc_opt),
            # obs and next_obs as float32, for the expert and the generator row
            input_bytes_per_transition=16 * obs_size,
            checkpointed=False,
        )
        self.memory_profile = profile
        return profile

    def _thread_policy(
        self,
        task: discriminator_task.DiscriminatorTask,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
    ) -> Optional[threads.ThreadPolicy]:
        """On a CPU, the calls' threads by their size, unless the user chose them.

        ``None`` also if the probe runs out of memory (the steps back off on their
        own, at the caller's threads), and for a compiled forward not otherwise
        probed (the probe's calls would compile shapes of their own).
        """
        if task.device.type != "cpu" or threads.explicit_choice() is not None:
            return None
        if self.memory_profile is None and self.acceleration.compile:
            return None
        try:
            return threads.ThreadPolicy.of(self._profile(task, expert, generated))
        except th.OutOfMemoryError:
            return None

    def _fit_budget(self, profile: probe.ActivationProfile) -> int:
        """Rows per minibatch that fit ``memory_budget`` (logged)."""
        assert self.memory_budget is not None
        cap, message = probe.fit_budget(
            self.memory_budget,
            profile,
            device=self._reward_net.device,
            resident_bytes=budget.resident_training_bytes(self._disc_opt),
            largest_batch=self.demo_batch_size,
            item=1,
            items="rows",
            unit=_ROW,
        )
        self.logger.log(message)
        return cap

    def _disc_samples(
        self,
        expert_samples: Optional[Mapping],
        gen_samples: Optional[Mapping],
    ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
        expert_name, gen_name = "expert_samples", "gen_samples"
        if expert_samples is None:
            expert_samples = self._next_expert_batch()
            expert_name = "the demonstrations' batch"
        # imitation's order: the replay buffer is checked before the samples are.
        if gen_samples is None:
            if self._gen_replay_buffer.size() == 0:
                raise RuntimeError(
                    "No generator samples for training. Call `train_gen()` first.",
                )
            # One draw per step, as imitation's: the split draws nothing.
            sampled = self._gen_replay_buffer.sample(self.demo_batch_size)
            gen_samples = types.dataclass_quick_asdict(sampled)
            gen_name = "the generator replay buffer's sample"
        return discriminator_task.step_arrays(
            (expert_name, expert_samples),
            (gen_name, gen_samples),
            batch_size=self.demo_batch_size,
            obs_shape=tuple(self.venv.observation_space.shape or ()),
        )

    def _policy_log_probs(
        self,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
        rows: Sequence[slice],
    ) -> Optional[List[th.Tensor]]:
        """The generator policy's log-probabilities of each chunk's actions.

        Per slice of ``rows``: of its expert actions, then of its generator ones
        (a hook: GAIL's discriminator reads none).
        """
        device = self.gen_algo.device
        chunks = []
        for r in rows:
            obs = discriminator_task.in_layout(
                "the policy's observations",
                np.concatenate([expert["obs"][r], generated["obs"][r]]),
                tuple(self.policy.observation_space.shape or ()),
                whose="the generator policy's",
            )
            acts = np.concatenate([expert["acts"][r], generated["acts"][r]])
            # Without gradient and in evaluation mode (SB3 leaves the policy in
            # training mode after learn()): dropout or batch norm in the policy must
            # not make the log-probabilities depend on the split.
            with th.no_grad(), networks.evaluating(self.policy):
                log_probs = self._get_log_policy_act_prob(
                    th.as_tensor(obs, device=device), th.as_tensor(acts, device=device)
                )
            if log_probs is None:
                return None
            chunks.append(log_probs.reshape(len(obs)).to(self.reward_train.device))
        return chunks

    def _disc_task(self) -> discriminator_task.DiscriminatorTask:
        devices = {self.reward_train.device.type, th.device(self.gen_algo.device).type}
        return discriminator_task.DiscriminatorTask(
            self.logits_expert_is_high,
            self.reward_train,
            self._reward_net,
            stager=staging.Stager() if self.acceleration.pinned_staging else None,
            pin_memory="cuda" in devices,
        )

    def train(
        self, total_timesteps: int, callback: Optional[Callable[[int], None]] = None
    ) -> None:
        """Imitation's ``train``, the ``acceleration`` applied once per round.

        It holds from a round's first discriminator step to its last: the
        generator trains, and ``callback`` runs, with the net as it is.
        """

        def released(round_num: int) -> None:
            self._release_acceleration()
            if callback is not None:
                callback(round_num)

        self._in_train = True
        try:
            super().train(total_timesteps, released)
        finally:
            self._in_train = False
            self._release_acceleration()

    def train_gen(
        self,
        total_timesteps: Optional[int] = None,
        learn_kwargs: Optional[Mapping] = None,
    ) -> None:
        """Imitation's ``train_gen``, the net without the ``acceleration`` options."""
        self._release_acceleration()
        super().train_gen(total_timesteps, learn_kwargs)

    def _accelerated(self) -> contextlib.AbstractContextManager:
        """The ``acceleration`` for a discriminator step (held inside ``train``)."""
        if not self._in_train:
            return self.acceleration.applied(self._reward_net)
        if self._held_acceleration is None:
            held = contextlib.ExitStack()
            held.enter_context(self.acceleration.applied(self._reward_net))
            self._held_acceleration = held
        return contextlib.nullcontext()

    def _release_acceleration(self) -> None:
        held, self._held_acceleration = self._held_acceleration, None
        if held is not None:
            held.close()

    def _step(
        self,
        task: discriminator_task.DiscriminatorTask,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
        policy: StepPolicy,
    ) -> Tuple[StepResult, th.Tensor]:
        """Plans and runs one step; out of memory, redone with half-size chunks.

        Returns:
            The step's result and the labels in the order of its logits.
        """
        rows = np.ones(self.demo_batch_size, dtype=np.int64)  # expert + generator
        update = Update(self._disc_opt, max_grad_norm=self.max_grad_norm)
        while True:
            plan = plan_step(rows, policy)
            try:
                with threads.intra_op(plan.threads):
                    log_probs = self._policy_log_probs(
                        expert, generated, plan.item_chunks
                    )
                    chunks = task.chunks(expert, generated, plan.item_chunks, log_probs)
                    result = self.engine.step(
                        task, chunks, plan=plan, n_items=2 * len(rows), update=update
                    )
                break
            except th.OutOfMemoryError as error:
                policy = policy.backed_off(plan, error)
            # Outside the handler: the error's frames (and tensors) are gone.
            if self.reward_train.device.type == "cuda":
                th.cuda.empty_cache()
            self.logger.log(
                "out of memory: step redone with chunks of at most "
                f"{policy.chunk_cap} {policy.unit}s"
            )
        self.step_policy = policy
        return result, th.cat([chunk.labels for chunk in chunks])

    def train_disc(
        self,
        *,
        expert_samples: Optional[Mapping] = None,
        gen_samples: Optional[Mapping] = None,
    ) -> Mapping[str, float]:
        """Performs one discriminator update over one batch, in exact minibatches.

        Args:
            expert_samples: Expert transitions (``obs``, ``acts``, ``next_obs``,
                ``dones``; arrays or tensors), exactly ``demo_batch_size`` of them;
                by default the next batch of the demonstrations.
            gen_samples: Generator transitions in the same form and number; by
                default drawn from the generator replay buffer.

        Returns:
            imitation's statistics (loss, accuracy, ...), of the whole batch.

        Raises:
            TypeError: naming an assigned setting of the wrong type.
            ValueError: naming an assigned setting out of range, or if the samples
                do not hold ``demo_batch_size`` transitions in the environment's
                observation shape (before any update).
            RuntimeError: if no generator samples are given or buffered.
            FloatingPointError: if the loss or gradient is not finite; the
                discriminator is then as before the call.
        """
        # Assigned settings ("6GiB" included) are parsed and checked here.
        self._use_settings(
            DiscriminatorSettings(
                demo_batch_size=self.demo_batch_size,
                demo_minibatch_size=self.demo_minibatch_size,
                max_grad_norm=self.max_grad_norm,
                memory_budget=self.memory_budget,
                acceleration=self.acceleration,
            )
        )
        with self.logger.accumulate_means("disc"), self._accelerated():
            write_summaries = self._init_tensorboard and self._global_step % 20 == 0
            expert, generated = self._disc_samples(expert_samples, gen_samples)
            task = self._disc_task()
            # A cap found by the budget's probe or an out-of-memory back-off holds
            # for later steps too.
            cap = None if self.step_policy is None else self.step_policy.chunk_cap
            if self.memory_budget is not None and self._budget_cap is None:
                profile = self._profile(task, expert, generated)
                self._budget_cap = self._fit_budget(profile)
                cap = self._budget_cap if cap is None else min(cap, self._budget_cap)
            policy = StepPolicy(
                minibatch_size=self.demo_minibatch_size,
                chunk_cap=cap,
                two_pass=False,
                unit=_ROW,
                threads=self._thread_policy(task, expert, generated),
            )
            result, labels = self._step(task, expert, generated, policy)
            self._disc_step += 1
            self.last_disc_result = result
            assert result.item_outputs is not None  # the task returns its logits
            logits = result.item_outputs
            # imitation's statistics of the whole batch (imitation 1.0.1 reports
            # the last minibatch's, with a scaled-down loss).
            train_stats = common.compute_train_stats(
                logits, labels.long(), th.tensor(result.loss)
            )
            self.logger.record("global_step", self._global_step)
            for key, value in train_stats.items():
                self.logger.record(key, value)
            self.logger.dump(self._disc_step)
            if write_summaries:
                self._summary_writer.add_histogram("disc_logits", logits)
        return train_stats


class AIRL(AccumulatingAdversarialTrainer, imitation_airl.AIRL):
    """Drop-in for imitation's AIRL, with an exact minibatched discriminator update.

    imitation's arguments and defaults, plus those of
    :class:`AccumulatingAdversarialTrainer`. For image observations use a CNN
    reward net such as :class:`imitation_accum.reward_nets.CnnShapedRewardNet`.

    Example:
        >>> from imitation_accum import AIRL  # doctest: +SKIP
        >>> trainer = AIRL(  # doctest: +SKIP
        ...     demonstrations=transitions,
        ...     demo_batch_size=1024,
        ...     demo_minibatch_size=100,
        ...     venv=venv,
        ...     gen_algo=PPO("MlpPolicy", venv),
        ...     reward_net=BasicShapedRewardNet(
        ...         venv.observation_space, venv.action_space
        ...     ),
        ... )
        >>> trainer.train(100_000)  # doctest: +SKIP
    """


class GAIL(AccumulatingAdversarialTrainer, imitation_gail.GAIL):
    """Drop-in for imitation's GAIL, with an exact minibatched discriminator update.

    As :class:`AIRL`; the generator policy's log-probabilities, which GAIL does not
    read, are not computed (imitation 1.0.1 computes and discards them).

    Example:
        >>> trainer = GAIL(  # doctest: +SKIP
        ...     demonstrations=transitions,
        ...     demo_batch_size=1024,
        ...     demo_minibatch_size=96,
        ...     venv=venv,
        ...     gen_algo=PPO("CnnPolicy", venv),
        ...     reward_net=CnnRewardNet(venv.observation_space, venv.action_space),
        ... )
    """

    def _policy_log_probs(
        self,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
        rows: Sequence[slice],
    ) -> Optional[List[th.Tensor]]:
        return None  # not read by GAIL's discriminator
