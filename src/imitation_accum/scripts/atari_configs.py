"""Named configs shared by this package's experiments: Atari, and ``gpu_bf16``.

Every game runs on ``imitation_accum/<Game>NoFrameskip-v4`` (see
:mod:`imitation_accum.atari`): SB3's standard Atari preprocessing, 84x84 frames,
4 stacked, score masked, fixed horizon. The agent is SB3's PPO with its CNN policy
and rl-zoo's Atari hyperparameters (constant learning rate and clip range); the
reward net is imitation's ``CnnRewardNet`` with its defaults (two 3x3 convolutions
of 32 channels at full resolution, then a global average pool), which reads the
frames in the height-width-channel layout the environment gives; SB3 transposes
them (``VecTransposeImage``) for the policy only.

Host memory: frames stay uint8 and the frame store
(:class:`imitation_accum.PreferenceDataset`) keeps each distinct frame once, so all
5,000 comparisons of an Atari run are kept; :func:`host_memory_bytes` computes what
a run keeps, ``docs/sacred-and-atari.md`` explains the figures.

``gpu_bf16`` runs the preference trainer's reward net under ``torch.autocast`` in
bfloat16 (Ampere or later); the accelerator options (``acceleration``) stay as
configured, off by default, until they are measured on a device (``docs/gpu.md``).
"""

from typing import Any, Callable, Dict

from imitation.rewards import reward_nets
from imitation.util import networks
from stable_baselines3.common import policies

from imitation_accum.envs import atari

# Named config -> game (ALE name). Each has a known score region to mask.
GAMES = {
    "atari_beamrider": "BeamRider",
    "atari_breakout": "Breakout",
    "atari_enduro": "Enduro",
    "atari_pong": "Pong",
    "atari_qbert": "Qbert",
    "atari_seaquest": "Seaquest",
    "atari_spaceinvaders": "SpaceInvaders",
}

FRAME_BYTES = 84 * 84 * 4  # one stacked, preprocessed observation (uint8)
RAW_FRAME_BYTES = 210 * 160 * 3  # one raw ALE observation (uint8)

PREFERENCE_DEFAULTS: Dict[str, Any] = dict(
    total_timesteps=10_000_000,  # 40M frames, the usual Atari budget
    num_iterations=100,  # 100k agent steps (2.8 GB of frames) buffered per iteration
    total_comparisons=5000,
    comparison_queue_size=None,  # all 5,000: 7.3 GB in the frame store
    fragment_length=100,
    reward_trainer_kwargs=dict(
        epochs=3,
        batch_size=128,  # pairs per optimizer step
        minibatch_size=16,  # pairs per forward/backward: ~6 GiB of activations
    ),
)

#: The preference trainer's arguments for a bfloat16 run on a GPU (``gpu_bf16``).
GPU_BF16: Dict[str, Any] = {
    "reward_trainer_kwargs": {"autocast_dtype": "bfloat16"},
}

ADVERSARIAL_DEFAULTS: Dict[str, Any] = dict(
    total_timesteps=10_000_000,
    algorithm_kwargs=dict(
        demo_batch_size=1024,  # expert transitions per discriminator update
        demo_minibatch_size=256,  # expert transitions per forward/backward
        n_disc_updates_per_round=4,
    ),
    # Demonstrations of the same environment, saved with
    # imitation.data.serialize.save; set demonstrations.path.
    demonstrations=dict(source="local", path=None),
)


def environment(game: str, raw: bool = False) -> Dict[str, Any]:
    """The environment, policy and agent configs for ``game``.

    Args:
        game: An ALE game name, such as ``"Pong"``.
        raw: Whether to play seals' score-masked game on raw 210x160x3 ALE frames
            (no frame skip, stack or resize; imitation issue #506) instead.

    Returns:
        ``environment``, ``policy`` and ``rl`` ingredient configs.
    """
    return dict(
        environment=dict(
            gym_id=f"seals/{game}NoFrameskip-v4" if raw else atari.env_id(game),
            max_episode_steps=atari.DEFAULT_HORIZON,
            num_vec=8,
        ),
        policy=dict(policy_cls=policies.ActorCriticCnnPolicy),
        rl=dict(
            batch_size=1024,  # 128 steps x 8 environments per PPO update
            rl_kwargs=dict(
                batch_size=256,
                n_epochs=4,
                learning_rate=2.5e-4,
                clip_range=0.1,
                ent_coef=0.01,
                vf_coef=0.5,
            ),
        ),
    )


def reward() -> Dict[str, Any]:
    """The reward ingredient config of preference comparisons: ``CnnRewardNet``.

    Returns:
        The ``reward`` ingredient config.
    """
    return dict(
        net_cls=reward_nets.CnnRewardNet,
        net_kwargs=dict(normalize_input_layer=None),  # CNN nets take none
        normalize_output_layer=networks.RunningNorm,
    )


def adversarial_reward() -> Dict[str, Any]:
    """The reward ingredient config of AIRL and GAIL.

    AIRL gets a CNN reward plus a CNN potential
    (:class:`imitation_accum.reward_nets.CnnShapedRewardNet`), GAIL a
    ``CnnRewardNet``. The net classes go under ``algorithm_specific`` (as in
    imitation's own named configs): a top-level ``net_cls`` given in a named config
    would override the algorithm's.

    Returns:
        The ``reward`` ingredient config.
    """
    from imitation_accum.nets.shaped import CnnShapedRewardNet

    return dict(
        net_kwargs=dict(normalize_input_layer=None),  # CNN nets take none
        normalize_output_layer=networks.RunningNorm,
        algorithm_specific=dict(
            airl=dict(net_cls=CnnShapedRewardNet),
            gail=dict(net_cls=reward_nets.CnnRewardNet),
        ),
    )


def preference_config(game: str, raw: bool = False) -> Dict[str, Any]:
    """The ``atari_<game>`` named config of preference comparisons.

    On raw frames (``atari_pong_unwrapped``, imitation issue #506),
    ``fragment_length=100`` and ``batch_size=30`` as in that issue. One pair's
    activations (2 x 100 transitions of imitation's default ``CnnRewardNet``) take
    1.68 GiB (8.59 MiB per transition, measured by counting the bytes autograd
    saves), so a minibatch of 10 pairs (16.8 GiB) fits a 24 GiB GPU. The
    dataset holds 2 x 101 x 100,800 bytes = 20.4 MB per pair: 300 pairs is
    6.1 GB of host memory.

    Args:
        game: An ALE game name.
        raw: Whether to play on raw frames (see :func:`environment`).

    Returns:
        The named config.
    """
    config = dict(**environment(game, raw), reward=reward(), **PREFERENCE_DEFAULTS)
    if raw:
        config.update(
            num_iterations=400,  # 25k agent steps (2.5 GB of frames) per iteration
            comparison_queue_size=300,
            reward_trainer_kwargs=dict(epochs=3, batch_size=30, minibatch_size=10),
        )
    return config


def adversarial_config(game: str, raw: bool = False) -> Dict[str, Any]:
    """The ``atari_<game>`` named config of AIRL and GAIL.

    Args:
        game: An ALE game name.
        raw: Whether to play on raw frames (see :func:`environment`).

    Returns:
        The named config.
    """
    return dict(
        **environment(game, raw),
        reward=adversarial_reward(),
        **ADVERSARIAL_DEFAULTS,
    )


def config_host_memory_bytes(config: Dict[str, Any]) -> Dict[str, int]:
    """:func:`host_memory_bytes` of an Atari preference-comparisons config.

    Args:
        config: A named config of this module (or a preset built from one).

    Returns:
        As :func:`host_memory_bytes`.
    """
    raw = config["environment"]["gym_id"].startswith("seals/")
    pairs = config["total_comparisons"]
    if config["comparison_queue_size"] is not None:
        pairs = min(pairs, config["comparison_queue_size"])
    return host_memory_bytes(
        frame_bytes=RAW_FRAME_BYTES if raw else FRAME_BYTES,
        stack=1 if raw else FRAME_BYTES // (84 * 84),
        comparison_queue_size=pairs,
        fragment_length=config["fragment_length"],
        total_timesteps=config["total_timesteps"],
        num_iterations=config["num_iterations"],
    )


def host_memory_bytes(
    *,
    frame_bytes: int,
    stack: int = 1,
    comparison_queue_size: int,
    fragment_length: int,
    total_timesteps: int,
    num_iterations: int,
) -> Dict[str, int]:
    """Host memory a preference-comparison run keeps for frames, in bytes.

    The dataset is the frame store: a fragment of ``fragment_length`` transitions
    of ``stack``-frame stacks keeps ``fragment_length + stack`` single frames.

    Args:
        frame_bytes: Bytes of one observation.
        stack: Frames stacked in one observation (1: not stacked).
        comparison_queue_size: Pairs kept in the dataset.
        fragment_length: Transitions per fragment (each has one more frame).
        total_timesteps: Agent steps in the run.
        num_iterations: Iterations (agent training is buffered per iteration).

    Returns:
        ``dataset`` (the full queue), ``agent_buffer`` (one iteration's agent
        transitions) and their ``total``.
    """
    single_frame = frame_bytes // stack
    dataset = comparison_queue_size * 2 * (fragment_length + stack) * single_frame
    agent_buffer = total_timesteps // num_iterations * frame_bytes
    total = dataset + agent_buffer
    return dict(dataset=dataset, agent_buffer=agent_buffer, total=total)


def add_named_configs(
    ex: Any,
    fast: Dict[str, Any],
    game_config: Callable[..., Dict[str, Any]],
) -> None:
    """Replaces imitation's ``fast`` named config and adds the Atari ones.

    Args:
        ex: The sacred experiment.
        fast: The ``fast`` config, imitation's extended.
        game_config: The named config of a game (ALE name; ``raw=True``:
            ``atari_pong_unwrapped``).
    """
    del ex.named_configs["fast"]
    ex.add_named_config("fast", fast)
    for name, game in GAMES.items():
        ex.add_named_config(name, game_config(game))
    ex.add_named_config("atari_pong_unwrapped", game_config("Pong", raw=True))
