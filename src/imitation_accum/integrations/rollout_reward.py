"""The learned reward inside the RL loop: batched, computed only where used.

imitation's ``RewardVecEnvWrapper`` calls the reward net once per environment step
(8 frames a call in the Pong quickstart). While an on-policy agent (SB3's
``OnPolicyAlgorithm``: PPO, A2C) collects a rollout, nobody reads a step's reward
until the rollout buffer computes returns and advantages. This wrapper therefore
records the rollout's transitions, returns placeholder rewards (zeros), and
computes the learned reward for the whole rollout in large calls just before
``RolloutBuffer.compute_returns_and_advantage``, adding it to the buffer's rewards
(SB3's timeout bootstrap, already added there, is kept). A
``NormalizedRewardNet``'s statistics are replayed step by step, so they and the
rewards equal the per-step path's up to float round-off. See
``docs/rollout_reward.md``.

Other agents and wrappers that read each step's reward at once (off-policy replay
buffers, ``VecNormalize(norm_reward=True)``) keep imitation's per-step path; the
choice is logged once per wrapper. In ``sample()``'s extra rollouts, whose rewards
nobody reads, :class:`AgentTrainer` computes no learned reward for a stateless net;
a ``NormalizedRewardNet``'s are computed in batches there too, so its statistics
see every step, as in imitation.

Example:
    >>> venv = RewardVecEnvWrapper(buffering_venv, reward_net.predict_processed)
    >>> algo.set_env(venv)  # doctest: +SKIP
    >>> algo.learn(n, callback=venv.make_log_callback())  # doctest: +SKIP
"""

import contextlib
import dataclasses
import functools
import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

import numpy as np
import torch as th
from gymnasium import spaces
from imitation.algorithms import preference_comparisons
from imitation.rewards import reward_nets, reward_wrapper
from imitation.util import networks
from stable_baselines3.common import buffers, on_policy_algorithm, vec_env

from imitation_accum import _validation
from imitation_accum.planning import probe

_LOG = logging.getLogger(__name__)

#: Transitions per reward-net call at rollout end off a CPU (not yet measured on a
#: GPU). On a CPU a call holds what a training call of the same net may hold
#: (:meth:`~imitation_accum.planning.probe.ActivationProfile.forward_size`): a
#: CnnRewardNet on 84x84x4 frames ran about twice as fast per frame in calls of 16
#: to 64 as in calls of 256, the whole rollout suits an MLP.
CALL_SIZE = 256

# VecEnv wrappers that may sit between the agent and this wrapper without reading
# rewards. Any other (VecNormalize with norm_reward=True, VecMonitor, ...) keeps
# the per-step path.
_REWARD_BLIND_WRAPPERS: Tuple[type, ...] = (
    vec_env.VecTransposeImage,
    vec_env.VecFrameStack,
    vec_env.VecCheckNan,
    vec_env.VecExtractDictObs,
)


@dataclasses.dataclass(frozen=True)
class _Step:
    """One environment step of all envs, as the per-step path would see it."""

    obs: np.ndarray
    acts: np.ndarray
    next_obs: np.ndarray
    dones: np.ndarray


def _stateless(net: object) -> bool:
    # RewardNet's own predict_processed: predict_th in eval mode, no grad, no state.
    plain = reward_nets.RewardNet.predict_processed
    return getattr(type(net), "predict_processed", None) is plain


def _batchable_net(reward_fn: Callable[..., Any]) -> Optional[reward_nets.RewardNet]:
    """The net of a bound ``predict_processed`` this module can batch, else None."""
    net = getattr(reward_fn, "__self__", None)
    if not isinstance(net, reward_nets.RewardNet):
        return None
    if getattr(reward_fn, "__func__", None) is not type(net).predict_processed:
        return None
    if _stateless(net):
        return net
    normalized = reward_nets.NormalizedRewardNet.predict_processed
    base = getattr(net, "base", None)
    if type(net).predict_processed is normalized and _stateless(base):
        return net
    return None


class RewardVecEnvWrapper(reward_wrapper.RewardVecEnvWrapper):
    """imitation's ``RewardVecEnvWrapper``, batching the learned reward per rollout.

    Same constructor as imitation's, plus keyword arguments. The batched path runs
    inside ``learn()`` of an on-policy agent given :meth:`make_log_callback`'s
    callback (imitation's ``AgentTrainer`` and ``AdversarialTrainer`` pass it);
    anywhere else each step's reward is computed at once, as imitation does.

    Attributes:
        batched: Whether to batch where possible (read when ``learn()`` starts, so
            assigning it after construction works). False: imitation's per-step
            path everywhere, ``AgentTrainer.sample`` included. The class default
            is what ``patch()`` and the package's experiments use
            (``batched_rollout_reward``).
        call_size: Transitions per reward-net call at rollout end; None: sized as
            the net's training calls are on a CPU (found once, by the memory
            probe), :data:`CALL_SIZE` elsewhere.
    """

    batched: bool = True

    def __init__(
        self,
        venv: vec_env.VecEnv,
        reward_fn: Callable[..., np.ndarray],
        ep_history: int = 100,
        *,
        batched: Optional[bool] = None,
        call_size: Optional[int] = None,
    ) -> None:
        """Builds the wrapper (resets ``venv``, as imitation's does).

        Args:
            venv: The VecEnv to wrap.
            reward_fn: imitation's reward function; batched when it is a reward
                net's ``predict_processed`` (plain or ``NormalizedRewardNet``).
            ep_history: Learned-reward episode returns kept for logging.
            batched: Overrides the class default :attr:`batched` for this wrapper.
            call_size: Transitions per reward-net call at rollout end; None
                sizes the calls from the net (see :attr:`call_size`).

        Raises:
            TypeError: if ``batched`` is not a bool or ``call_size`` not an int.
            ValueError: if ``call_size`` is not positive.
        """
        if batched is not None:
            self.batched = bool(_validation.boolean("batched", batched))
        if call_size is not None:
            _validation.positive_int("call_size", call_size)
        if isinstance(venv, reward_wrapper.RewardVecEnvWrapper):
            raise ValueError("venv is already wrapped in a RewardVecEnvWrapper")
        self.call_size = call_size
        self._steps: Optional[List[_Step]] = None  # recording while not None
        self._discarding = False
        self._sampling = False  # recording outside learn(): flushed as it goes
        self._partial = np.zeros(venv.num_envs, dtype=bool)
        self._attached_to: Optional[Any] = None
        self._logged_choice = False
        super().__init__(venv, reward_fn, ep_history)

    def make_log_callback(self) -> reward_wrapper.WrappedRewardCallback:
        """The episode-return logging callback; it also starts the batched path."""
        return _RolloutRewardCallback(self)

    # The per-step decision -------------------------------------------------------

    def _per_step_reason(self, algorithm: Any) -> Optional[str]:
        if not self.batched:
            return "batched=False"
        if not isinstance(algorithm, on_policy_algorithm.OnPolicyAlgorithm):
            return (
                f"{type(algorithm).__name__} is off-policy: its replay buffer "
                "stores each step's reward"
            )
        if not isinstance(algorithm.rollout_buffer, buffers.RolloutBuffer):
            return f"rollout buffer {type(algorithm.rollout_buffer).__name__}"
        if _batchable_net(self.reward_fn) is None:
            return f"reward_fn {self.reward_fn!r} is not a batchable RewardNet"
        if isinstance(self.observation_space, spaces.Dict):
            return "dict observations"
        env = algorithm.get_env()
        while env is not self:
            if isinstance(env, vec_env.VecNormalize) and not env.norm_reward:
                pass
            elif not isinstance(env, _REWARD_BLIND_WRAPPERS):
                return f"{type(env).__name__} between the agent and this wrapper"
            env = getattr(env, "venv", None)
            if env is None:
                return "the agent's environment is not this wrapper"
        return None

    def _attach(self, algorithm: Any) -> None:
        """Chooses the path for one ``learn()``; hooks the rollout buffer if batched."""
        self._steps = None  # a learn() that raised mid-rollout left it recording
        reason = self._per_step_reason(algorithm)
        if not self._logged_choice:
            self._logged_choice = True
            _LOG.info(
                "Learned rewards: "
                + (
                    f"per environment step ({reason})"
                    if reason
                    else "batched at each rollout's end"
                )
            )
        self._attached_to = None
        if reason is None:
            _hook_buffer(algorithm.rollout_buffer, self)
            self._attached_to = algorithm

    def _detach(self) -> None:
        # A rollout stopped early (a callback returned False): its rewards feed
        # the statistics as the per-step path's would, though no buffer reads them.
        if self._steps:
            self._finish_rollout()
        self._steps = None
        self._attached_to = None

    def _start_rollout(self) -> None:
        if self._attached_to is not None:
            if self._steps:
                self._finish_rollout()
            self._steps = []

    # Stepping --------------------------------------------------------------------

    @property
    def _acts(self) -> np.ndarray:
        return cast(np.ndarray, self._actions)

    def step_wait(self) -> vec_env.base_vec_env.VecEnvStepReturn:
        """Steps; the learned reward is computed now, at rollout end, or not at all."""
        if isinstance(self.observation_space, spaces.Dict):
            return super().step_wait()  # dict observations: imitation's path only
        obs, old_rews, dones, infos = self.venv.step_wait()
        # The next observation of a done step, found as imitation's step_wait does
        # (copied: its reward call and statistics have no hook).
        next_obs = np.stack(
            [
                info["terminal_observation"] if done else single_obs
                for single_obs, done, info in zip(obs, dones, infos)
            ]
        )
        dones = np.asarray(dones, dtype=bool).reshape(len(dones))
        if self._steps is not None:
            self._steps.append(
                _Step(cast(np.ndarray, self._old_obs), self._acts, next_obs, dones)
            )
            rews = np.zeros(len(dones), dtype=np.float32)
            if self._sampling and len(self._steps) * len(dones) >= (
                self.call_size or CALL_SIZE
            ):  # nothing reads these rewards: hold one call's worth of frames
                self._finish_rollout()
                self._steps = []
        elif self._discarding:  # these episodes' learned returns stay unknown
            self._partial[:] = True
            rews = np.zeros(len(dones), dtype=np.float32)
        else:
            rews = self.reward_fn(
                cast(np.ndarray, self._old_obs), self._acts, next_obs, dones
            )
            if len(rews) != len(dones):
                raise ValueError(
                    f"reward_fn returned {len(rews)} rewards for {len(dones)} envs"
                )
            self._record_returns(rews, dones)
        self._old_obs = obs  # type: ignore[assignment]
        for info, old_rew in zip(infos, old_rews):
            info["original_env_rew"] = old_rew
        return obs, rews, dones, infos

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        """Steps whose learned rewards nobody reads (``AgentTrainer.sample``).

        A stateless reward net (a plain net's ``predict_processed``) is not called:
        the steps get zeros and episodes with such steps are left out of the logged
        learned returns. A ``NormalizedRewardNet`` over a plain net is called in
        batches of about :attr:`call_size` transitions, its statistics replayed step
        by step, so they and the logged returns equal imitation's per-step path up
        to float round-off. Any other ``reward_fn`` (which may hold state) is
        called per step, as in imitation; so is every net when :attr:`batched` is
        False.

        Yields:
            Nothing.
        """
        net = _batchable_net(self.reward_fn)
        if not self.batched or self._steps is not None or net is None:
            yield  # imitation's path; a rollout in learn() keeps recording
            return
        if _stateless(net):
            self._discarding = True
            try:
                yield
            finally:
                self._discarding = False
            return
        self._steps, self._sampling = [], True
        try:
            yield
            self._finish_rollout()  # the statistics see every step, in order
        finally:
            self._steps, self._sampling = None, False

    # Rollout end -----------------------------------------------------------------

    def _finish_rollout(self) -> np.ndarray:
        """The recorded steps' learned rewards, ``(steps, envs)``; statistics fed."""
        steps, self._steps = self._steps or [], None
        net = _batchable_net(self.reward_fn)
        if net is None:  # reward_fn reassigned mid-learn: not batchable any more
            rewards = [
                self.reward_fn(s.obs, s.acts, s.next_obs, s.dones) for s in steps
            ]
        else:
            if self.call_size is None and steps:
                self.call_size = _call_size(net, steps[0])
            rewards = _rollout_rewards(net, steps, self.call_size or CALL_SIZE)
        for step, rews in zip(steps, rewards):
            self._record_returns(rews, step.dones)
        return np.stack(rewards) if rewards else np.zeros((0, self.num_envs))

    def _record_returns(self, rews: np.ndarray, dones: np.ndarray) -> None:
        # imitation's episode statistics, per step; episodes with discarded steps
        # are dropped.
        self._cumulative_rew += rews
        for env, done in enumerate(dones):
            if done and not self._partial[env]:
                self.episode_rewards.append(self._cumulative_rew[env])
        self._cumulative_rew[dones] = 0
        self._partial[dones] = False


def _call_size(net: reward_nets.RewardNet, step: _Step) -> int:
    """Transitions per call: on a CPU, as many as one training call would hold."""
    raw_net = cast(
        reward_nets.RewardNet,
        net.base if isinstance(net, reward_nets.NormalizedRewardNet) else net,
    )
    if raw_net.device.type != "cpu":
        return CALL_SIZE
    repeats = -(-4 // len(step.dones))  # the probe calls 2 and 4 transitions
    inputs = raw_net.preprocess(
        *(
            np.concatenate([x] * repeats)
            for x in (step.obs, step.acts, step.next_obs, step.dones)
        )
    )

    def run(count: int) -> th.Tensor:
        return raw_net(*(x[:count] for x in inputs))

    with networks.evaluating(raw_net):  # input norm layers must not update
        profile = probe.profile_activations(
            run,
            max_transitions=len(inputs[0]),
            params=list(raw_net.parameters()),
            device=raw_net.device,
            fixed_bytes=0,
            input_bytes_per_transition=sum(
                x[:1].nelement() * x.element_size() for x in inputs
            ),
        )
    return profile.forward_size() or CALL_SIZE


def _rollout_rewards(
    net: reward_nets.RewardNet, steps: List[_Step], call_size: int
) -> List[np.ndarray]:
    """Each step's learned reward, as per-step ``net.predict_processed`` gives it.

    The net's raw rewards come from calls of about ``call_size`` transitions (no
    gradient, on the net's device, frames uint8 until there); a
    ``NormalizedRewardNet``'s normalization is then replayed step by step:
    normalized with the statistics before the step, updated with its batch.
    """
    if not steps:
        return []
    normalized = isinstance(net, reward_nets.NormalizedRewardNet)
    raw_net = cast(reward_nets.RewardNet, net.base if normalized else net)
    n_envs = len(steps[0].dones)
    per_call = max(1, call_size // n_envs)
    raw: List[np.ndarray] = []
    for start in range(0, len(steps), per_call):
        chunk = steps[start : start + per_call]
        rews = raw_net.predict_processed(
            np.concatenate([s.obs for s in chunk]),
            np.concatenate([s.acts for s in chunk]),
            np.concatenate([s.next_obs for s in chunk]),
            np.concatenate([s.dones for s in chunk]),
        )
        raw.extend(np.split(rews, len(chunk)))
    if not normalized:
        return raw
    # NormalizedRewardNet.predict_processed's own operations, step by step.
    layer = cast(networks.BaseNorm, net.normalize_output_layer)
    out = []
    with networks.evaluating(net):
        for rews in raw:
            rew_th = th.tensor(rews, device=net.device)
            out.append(layer(rew_th).detach().cpu().numpy().flatten())
            with th.no_grad():
                layer.update_stats(rew_th)
    return out


def _compute_with_learned_rewards(
    buffer: buffers.RolloutBuffer,
    original: Callable[..., None],
    wrapper: RewardVecEnvWrapper,
    *args: Any,
    **kwargs: Any,
) -> None:
    # SB3 calls compute_returns_and_advantage before callback.on_rollout_end, so
    # the rewards join the buffer here; added, keeping SB3's timeout bootstrap.
    if wrapper._steps is not None:
        rewards = wrapper._finish_rollout()
        n_steps = buffer.buffer_size if buffer.full else buffer.pos
        if rewards.shape != buffer.rewards[:n_steps].shape:
            raise RuntimeError(
                f"recorded {rewards.shape} rewards for a rollout buffer holding "
                f"{buffer.rewards[:n_steps].shape}"
            )
        buffer.rewards[:n_steps] += rewards
    original(*args, **kwargs)


def _hook_buffer(buffer: buffers.RolloutBuffer, wrapper: RewardVecEnvWrapper) -> None:
    """Points ``buffer.compute_returns_and_advantage`` at ``wrapper`` (no stacking)."""
    original = getattr(buffer, "_plain_compute_returns", None)
    if original is None:
        original = buffer.compute_returns_and_advantage
        buffer._plain_compute_returns = original  # type: ignore[attr-defined]
    buffer.compute_returns_and_advantage = functools.partial(  # type: ignore[method-assign]
        _compute_with_learned_rewards, buffer, original, wrapper
    )


class _RolloutRewardCallback(reward_wrapper.WrappedRewardCallback):
    """imitation's episode-return logging, and the batched path's start and end."""

    def __init__(self, wrapper: RewardVecEnvWrapper) -> None:
        super().__init__(wrapper.episode_rewards)
        self.wrapper = wrapper

    def _on_training_start(self) -> None:
        self.wrapper._attach(self.model)

    def _on_rollout_start(self) -> None:
        super()._on_rollout_start()
        self.wrapper._start_rollout()

    def _on_training_end(self) -> None:
        self.wrapper._detach()


#: The config key of the package's sacred experiments (default True): whether their
#: runs batch the learned reward (:attr:`RewardVecEnvWrapper.batched`).
CONFIG_KEY = "batched_rollout_reward"


def add_config_key(ex: Any) -> None:
    """Adds :data:`CONFIG_KEY` to sacred experiment ``ex``: checked, set per run.

    Args:
        ex: A sacred experiment run under ``patch()``.
    """
    ex.add_config({CONFIG_KEY: True})
    ex.config_hook(_check_config_key)
    ex.pre_run_hook(_use_config_key)


def _check_config_key(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    del command_name, logger
    _validation.boolean(CONFIG_KEY, config.get(CONFIG_KEY, True))
    return {}


def _use_config_key(batched_rollout_reward: bool) -> None:
    # For this run's wrappers; unpatch() restores the default.
    RewardVecEnvWrapper.batched = batched_rollout_reward


def restore_default() -> None:
    """Sets :attr:`RewardVecEnvWrapper.batched` back to True (``unpatch()`` does)."""
    RewardVecEnvWrapper.batched = True


class AgentTrainer(preference_comparisons.AgentTrainer):
    """imitation's ``AgentTrainer``; ``sample()`` feeds only running statistics.

    ``sample()``'s extra rollouts keep the environment's rewards in the fragments
    they return, so their learned rewards are read by nobody; only a net's running
    statistics (``NormalizedRewardNet``) see them. See
    :meth:`RewardVecEnvWrapper.sampling`.
    """

    def sample(self, steps: int) -> Any:
        """As in imitation; the learned reward computed only where it holds state.

        Args:
            steps: Transitions to return, as in imitation.

        Returns:
            The trajectories, with the environment's rewards.
        """
        wrapper = self.reward_venv_wrapper
        if not isinstance(wrapper, RewardVecEnvWrapper):
            return super().sample(steps)
        with wrapper.sampling():
            return super().sample(steps)
