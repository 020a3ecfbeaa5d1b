"""Drop-in AIRL and GAIL whose discriminator accumulates gradients exactly.

:class:`AIRL` and :class:`GAIL` are imitation's trainers (same arguments and
defaults) with a discriminator update built on the package's accumulation engine:
one batch of ``demo_batch_size`` expert and as many generator transitions is drawn
per step and split into minibatches of any size; the update, the
``RunningNorm``/``EMANorm`` statistics and the logged statistics are those of the
whole batch. The generator (``train_gen``) is imitation's, unchanged.

Image observations work with a CNN policy: every frame the reward net sees is in
the layout of the trainer's ``venv`` (``(height, width, channels)`` for gymnasium's
Atari), as the generator replay buffer stores it; demonstrations in the other
layout (recorded behind SB3's ``VecTransposeImage``) are brought to it. Only the
generator policy's log-probabilities (AIRL) see frames transposed to the policy's
own layout, as Stable-Baselines3 does for its own forward passes.
"""

from typing import (
    Any,
    ClassVar,
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
from imitation.algorithms.adversarial import common
from imitation.data import types
from imitation.rewards import reward_nets
from imitation.util import networks
from stable_baselines3.common import base_class, vec_env

from imitation_accum.adversarial import discriminator_task
from imitation_accum.adversarial.arguments import (
    check_arguments,
    check_max_grad_norm,
    policy_observations,
)
from imitation_accum.engine import acceleration as acceleration_options
from imitation_accum.engine import staging
from imitation_accum.engine.accumulator import GradientAccumulator, StepResult
from imitation_accum.planning import budget, probe
from imitation_accum.planning.plan import StepPlan, StepPolicy, run_step


class AccumulatingAdversarialTrainer(common.AdversarialTrainer):
    """imitation's adversarial trainer with an accumulated discriminator update.

    The base of :class:`~imitation_accum.AIRL` and :class:`~imitation_accum.GAIL`.

    Args:
        demonstrations: Expert demonstrations, as in imitation.
        demo_batch_size: Expert transitions per discriminator step.
        venv: The vectorized environment.
        gen_algo: The generator (AIRL: a stochastic SB3 policy, such as PPO's).
        reward_net: The reward net of the discriminator (AIRL: usually shaped;
            GAIL: the discriminator's logits net).
        demo_minibatch_size: Expert transitions (and as many generator
            transitions) per forward/backward, any value in
            ``[1, demo_batch_size]``, divisible or not; ``None`` means the whole
            batch. Every size gives the full-batch update.
        minibatch_size: Alias of ``demo_minibatch_size``.
        max_grad_norm: Clip the discriminator's gradient norm to this, once per
            discriminator step.
        memory_budget: Instead of ``demo_minibatch_size``: bytes, a size such as
            ``"6GiB"``, or ``"auto"``; minibatches are sized to fit it by a probe of
            the discriminator on a few transitions at the first discriminator
            step (logged). On CUDA, a step that runs out of memory anyway is
            redone with minibatches half as large.
        acceleration: Accelerator options for the discriminator, all off by
            default: an :class:`~imitation_accum.engine.acceleration.Acceleration`
            or a mapping of its fields; see ``docs/gpu.md``.
        **kwargs: imitation's further ``AdversarialTrainer`` arguments
            (``n_disc_updates_per_round``, ``disc_opt_cls``, ``disc_opt_kwargs``,
            ``custom_logger``, ...), with imitation's defaults.

    Raises:
        ValueError: if a minibatch size is not a positive int or exceeds
            ``demo_batch_size``, the alias disagrees, ``max_grad_norm`` is not a
            positive number, ``memory_budget`` does not parse, is smaller than
            the discriminator's parameters, gradients and optimizer state, or is
            given with a minibatch size, ``n_disc_updates_per_round`` or
            ``gen_train_timesteps`` is not a positive count,
            ``disc_opt_kwargs`` is not a mapping, or the reward net holds a
            batch-norm layer (which cannot be accumulated exactly); see
            :func:`~imitation_accum.adversarial.arguments.check_arguments`.
    """

    #: Whether the discriminator reads the generator policy's log-probabilities.
    _uses_policy_log_probs: ClassVar[bool] = True

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
        checked = check_arguments(
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
        batch_size = checked.demo_batch_size
        self.acceleration = checked.acceleration
        self.acceleration.check_net(reward_net)
        # imitation rejects a demo_minibatch_size that does not divide
        # demo_batch_size; any size is exact here, so it gets None and the size is
        # set below.
        super().__init__(
            demonstrations=demonstrations,
            demo_batch_size=batch_size,
            venv=venv,
            gen_algo=gen_algo,
            reward_net=reward_net,
            demo_minibatch_size=None,
            **kwargs,
        )
        self.demo_minibatch_size = checked.demo_minibatch_size or batch_size
        self.memory_budget = checked.memory_budget
        self.last_disc_result: Optional[StepResult] = None
        self._engine: GradientAccumulator[discriminator_task.DiscriminatorChunk] = (
            GradientAccumulator(
                self._reward_net, self._disc_opt, max_grad_norm=checked.max_grad_norm
            )
        )
        self._budget_cap: Optional[int] = None
        self._backed_off_cap: Optional[int] = None
        self.step_policy: Optional[StepPolicy] = None
        """The step policy the last discriminator step ran with."""
        self.memory_profile: Optional[probe.ActivationProfile] = None
        """The memory probe's profile of the discriminator, with a budget."""
        budget.check_holds_training_state(
            self.memory_budget,
            self._disc_opt,
            "the discriminator's parameters, gradients and optimizer state",
        )
        budget.check_fits_device(self.memory_budget, self._reward_net.device)

    @property
    def engine(
        self,
    ) -> GradientAccumulator[discriminator_task.DiscriminatorChunk]:
        """The accumulation engine stepping the discriminator."""
        return self._engine

    @property
    def max_grad_norm(self) -> Optional[float]:
        """The discriminator's gradient norm is clipped to this once per step."""
        return self._engine.max_grad_norm

    @max_grad_norm.setter
    def max_grad_norm(self, value: Optional[float]) -> None:
        self._engine.max_grad_norm = check_max_grad_norm(value)

    def _step_policy(self) -> StepPolicy:
        """The discriminator's step policy, from this trainer's attributes.

        Items are rows of an expert and a generator transition: one call each
        chunk, never split.
        """
        caps = [c for c in (self._budget_cap, self._backed_off_cap) if c is not None]
        return StepPolicy(
            minibatch_size=self.demo_minibatch_size,
            chunk_cap=min(caps) if caps else None,
            forward_size=None,
            two_pass=False,
            unit="row (an expert and a generator transition)",
        )

    def _fit_budget(
        self,
        task: discriminator_task.DiscriminatorTask,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
    ) -> int:
        """Rows per minibatch that fit ``memory_budget`` (a probe on a few rows).

        Raises:
            ValueError: if not even one row (an expert and a generator transition)
                fits.
        """
        assert self.memory_budget is not None
        frame_bytes = 4 * int(np.prod(self.venv.observation_space.shape or ()))
        log_probs = self._policy_log_probs if self._uses_policy_log_probs else None

        def call(start: int, stop: int) -> th.Tensor:
            rows = [slice(0, stop - start)]
            staged = discriminator_task.stage_batch(
                {key: value[start:stop] for key, value in expert.items()},
                {key: value[start:stop] for key, value in generated.items()},
                rows,
                keys=task.staged_keys,
            )
            (chunk,) = discriminator_task.make_chunks(
                staged, rows, task.device, log_probs
            )
            return task.forward(chunk, stop - start)

        profile = probe.profile_calls(
            call,
            min(4, self.demo_batch_size),
            measuring=lambda ckpt: self._engine.measuring(checkpointing=ckpt),
            params=list(self._reward_net.parameters()),
            device=task.device,
            fixed_bytes=budget.training_state_bytes(self._disc_opt),
            # obs and next_obs as float32, for the expert and the generator row
            input_bytes_per_transition=4 * frame_bytes,
            checkpointed=False,
        )
        self.memory_profile = profile
        cap, in_bytes = probe.fit_budget(
            self.memory_budget,
            profile,
            device=task.device,
            resident_bytes=budget.resident_training_bytes(self._disc_opt),
            largest_batch=self.demo_batch_size,
            unit="row (an expert and a generator transition)",
        )
        self.logger.log(
            probe.budget_message(
                in_bytes,
                profile,
                cap=cap,
                item=1,
                largest_batch=self.demo_batch_size,
                items="rows",
            ),
        )
        return cap

    def _disc_samples(
        self,
        *,
        expert_samples: Optional[Mapping] = None,
        gen_samples: Optional[Mapping] = None,
    ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
        """Draws (or checks) one step's expert and generator samples."""
        batch_size = self.demo_batch_size
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
            sampled = self._gen_replay_buffer.sample(batch_size)
            gen_samples = types.dataclass_quick_asdict(sampled)
            gen_name = "the generator replay buffer's sample"
        return discriminator_task.step_arrays(
            (expert_name, expert_samples),
            (gen_name, gen_samples),
            batch_size=batch_size,
            obs_shape=tuple(self.venv.observation_space.shape or ()),
        )

    def _policy_log_probs(
        self,
        chunk: discriminator_task.DiscriminatorChunk,
    ) -> Optional[th.Tensor]:
        """The generator policy's log-probabilities of a chunk's actions.

        Computed without gradient and in evaluation mode (SB3 leaves the policy in
        training mode after ``learn()``), so that dropout or batch-norm layers in
        the policy cannot make them depend on the split.
        """
        obs, acts = chunk.raw(self.gen_algo.device, ("obs", "acts"))
        with th.no_grad(), networks.evaluating(self.policy):
            obs = policy_observations(obs, self.policy.observation_space)
            log_probs = self._get_log_policy_act_prob(obs, acts)
        if log_probs is None:
            return None
        return log_probs.reshape(len(obs)).to(self.reward_train.device)

    def _disc_chunks(
        self,
        task: discriminator_task.DiscriminatorTask,
        expert: Mapping[str, np.ndarray],
        generated: Mapping[str, np.ndarray],
        rows: Sequence[slice],
    ) -> List[discriminator_task.DiscriminatorChunk]:
        """The minibatches of ``rows``, with the policy's log-probabilities if used."""
        devices = {self.reward_train.device.type, th.device(self.gen_algo.device).type}
        batch = discriminator_task.stage_batch(
            expert,
            generated,
            rows,
            keys=task.staged_keys,
            pin_memory="cuda" in devices,
        )
        log_probs = self._policy_log_probs if self._uses_policy_log_probs else None
        chunks = discriminator_task.make_chunks(
            batch, rows, self.reward_train.device, log_probs
        )
        task.stage(chunks)
        return chunks

    def _disc_task(self) -> discriminator_task.DiscriminatorTask:
        task = discriminator_task.DiscriminatorTask(
            self.logits_expert_is_high,
            self.reward_train,
            self._reward_net,
        )
        if self.acceleration.pinned_staging:
            task.stager = staging.Stager()
        return task

    def train_disc(
        self,
        *,
        expert_samples: Optional[Mapping] = None,
        gen_samples: Optional[Mapping] = None,
    ) -> Mapping[str, float]:
        """Performs one discriminator update over one batch, in minibatches.

        The update equals one step on the whole batch; the returned and logged
        statistics describe the whole batch (same keys as imitation's).

        Args:
            expert_samples: Expert transitions (``obs``, ``acts``, ``next_obs``,
                ``dones``; arrays or tensors), exactly ``demo_batch_size`` of them;
                by default the next batch of the demonstrations.
            gen_samples: Generator transitions in the same form and number; by
                default drawn from the generator replay buffer.

        Returns:
            Statistics of the discriminator on the batch (loss, accuracy, ...).

        Raises:
            ValueError: if the samples do not hold ``demo_batch_size`` transitions
                in the environment's observation shape (before any update).
            RuntimeError: if no generator samples are given or buffered.
            FloatingPointError: if the loss or gradient is not finite; the
                discriminator is then as before the call.
        """
        accelerated = acceleration_options.maybe_applied(
            self.acceleration, self._reward_net
        )
        with self.logger.accumulate_means("disc"), accelerated:
            write_summaries = self._init_tensorboard and self._global_step % 20 == 0
            expert, generated = self._disc_samples(
                expert_samples=expert_samples,
                gen_samples=gen_samples,
            )
            task = self._disc_task()
            if self.memory_budget is not None and self._budget_cap is None:
                self._budget_cap = self._fit_budget(task, expert, generated)
            policy = self._step_policy()

            def step(plan: StepPlan) -> Tuple[StepResult, th.Tensor]:
                chunks = self._disc_chunks(task, expert, generated, plan.item_chunks)
                result = self._engine.step(
                    task,
                    chunks,
                    plan=plan,
                    n_items=2 * self.demo_batch_size,
                )
                # Labels in the order of the logits: the chunks' own.
                return result, th.cat([chunk.labels for chunk in chunks])

            ran, _, (result, labels) = run_step(
                np.ones(self.demo_batch_size, dtype=np.int64),
                step,
                policy,
                device=self.reward_train.device,
                log=self.logger.log,
            )
            if ran.chunk_cap != policy.chunk_cap:
                self._backed_off_cap = ran.chunk_cap  # for later steps too
            self.step_policy = ran
            self._disc_step += 1
            self.last_disc_result = result
            assert result.item_outputs is not None  # the task returns its logits
            logits = result.item_outputs
            train_stats = discriminator_task.batch_statistics(
                logits, labels, result.loss
            )
            self.logger.record("global_step", self._global_step)
            for key, value in train_stats.items():
                self.logger.record(key, value)
            self.logger.dump(self._disc_step)
            if write_summaries:
                self._summary_writer.add_histogram("disc_logits", logits)
        return train_stats
