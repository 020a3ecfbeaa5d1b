"""The experiments' named configs (Atari, ``gpu_bf16``) and the presets of ``configs/``.

Every game runs on ``imitation_accum/<Game>NoFrameskip-v4`` (84x84 frames, 4 stacked,
score masked, fixed horizon) with SB3's PPO CNN policy, rl-zoo's Atari
hyperparameters, and imitation's ``CnnRewardNet`` as the reward net.
``gpu_bf16`` runs the preference trainer's reward net under bfloat16 autocast.

A preset is a named config written out whole (``with configs/NAME.json`` needs nothing
else) with a few keys changed: a ``memory_budget`` for a GPU, to which the planner
sizes minibatches (the batch, and so the result, is the same on every GPU), or a run
small enough for a CPU. ``python -m imitation_accum.scripts.presets`` rewrites them.
Activation memory per pair (``fragment_length=100``, default ``CnnRewardNet``):
0.358 GiB on 84x84x4 frames, 1.678 GiB on raw 210x160x3 frames.
"""

import argparse
import copy
import dataclasses
import json
import pathlib
import tempfile
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from imitation.rewards import reward_nets
from imitation.util import networks
from sacred.config import save_config_file
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
    # The first 500 pairs get 5 x 3 = 15 epochs (~60 steps of 128 pairs, what a
    # later iteration over the growing dataset takes), not imitation's 200 x 3 =
    # 600 epochs (2,400 steps) that overfit them while the agent waits.
    initial_epoch_multiplier=5,
    reward_trainer_kwargs=dict(
        epochs=3,
        batch_size=128,  # pairs per optimizer step
        minibatch_size=16,  # pairs per forward/backward: ~6 GiB of activations
    ),
)

#: The preference trainer's arguments for a bfloat16 run on a GPU (``gpu_bf16``).
GPU_BF16: Dict[str, Any] = {"reward_trainer_kwargs": {"autocast_dtype": "bfloat16"}}

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
    """The ``environment``, ``policy`` and ``rl`` configs for ALE game ``game``.

    ``raw``: play seals' score-masked game on raw 210x160x3 frames (imitation #506).
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
    """The ``reward`` ingredient config of preference comparisons: ``CnnRewardNet``."""
    return dict(
        net_cls=reward_nets.CnnRewardNet,
        net_kwargs=dict(normalize_input_layer=None),  # CNN nets take none
        normalize_output_layer=networks.RunningNorm,
    )


def preference_config(game: str, raw: bool = False) -> Dict[str, Any]:
    """The ``atari_<game>`` named config of preference comparisons.

    ``raw`` (``atari_pong_unwrapped``): ``batch_size=30`` as in imitation #506, in
    minibatches of 10 pairs (16.8 GiB of activations); 300 pairs keep 6.1 GB.
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
    """The ``atari_<game>`` named config of AIRL and GAIL (``raw``: raw frames).

    AIRL gets :class:`imitation_accum.reward_nets.CnnShapedRewardNet`, GAIL a
    ``CnnRewardNet``, under ``algorithm_specific`` (a top-level ``net_cls`` would
    override the algorithm's).
    """
    from imitation_accum.nets.shaped import CnnShapedRewardNet

    reward_config = dict(
        net_kwargs=dict(normalize_input_layer=None),  # CNN nets take none
        normalize_output_layer=networks.RunningNorm,
        algorithm_specific=dict(
            airl=dict(net_cls=CnnShapedRewardNet),
            gail=dict(net_cls=reward_nets.CnnRewardNet),
        ),
    )
    return dict(**environment(game, raw), reward=reward_config, **ADVERSARIAL_DEFAULTS)


def config_host_memory_bytes(config: Mapping[str, Any]) -> Dict[str, int]:
    """Host memory for frames of an Atari preference named config or preset, in bytes.

    The frame store keeps a fragment of ``fragment_length`` transitions of stacked
    observations as ``fragment_length + stack`` single frames; agent training keeps
    one iteration's transitions.

    Returns:
        ``dataset``, ``agent_buffer`` and their ``total``.
    """
    raw = config["environment"]["gym_id"].startswith("seals/")
    frame_bytes = RAW_FRAME_BYTES if raw else FRAME_BYTES
    stack = 1 if raw else FRAME_BYTES // (84 * 84)
    pairs = config["total_comparisons"]
    if config["comparison_queue_size"] is not None:
        pairs = min(pairs, config["comparison_queue_size"])
    single_frame = frame_bytes // stack
    dataset = pairs * 2 * (config["fragment_length"] + stack) * single_frame
    agent_buffer = config["total_timesteps"] // config["num_iterations"] * frame_bytes
    return dict(
        dataset=dataset, agent_buffer=agent_buffer, total=dataset + agent_buffer
    )


def add_named_configs(
    ex: Any, fast: Dict[str, Any], game_config: Callable[..., Dict[str, Any]]
) -> None:
    """Replaces imitation's ``fast`` named config of ``ex`` and adds the Atari ones.

    ``game_config(game, raw=False)`` gives a game's (``raw``: ``atari_pong_unwrapped``).
    """
    del ex.named_configs["fast"]
    ex.add_named_config("fast", fast)
    for name, game in GAMES.items():
        ex.add_named_config(name, game_config(game))
    ex.add_named_config("atari_pong_unwrapped", game_config("Pong", raw=True))


CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[3] / "configs"


@dataclasses.dataclass(frozen=True)
class Preset:
    """A JSON preset of preference comparisons: a named config, some keys changed.

    Args:
        named_config: The named config it starts from.
        changes: Keys changed (nested dictionaries are merged).
        description: What it is for (the README's table).
    """

    named_config: str
    changes: Mapping[str, Any]
    description: str

    def config(self) -> Dict[str, Any]:
        """The named config with :attr:`changes` merged in."""
        raw = self.named_config == "atari_pong_unwrapped"
        game = "Pong" if raw else GAMES[self.named_config]
        return _merged(preference_config(game, raw), self.changes)


def _merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _gpu(named_config: str, gib: int, pairs: int, per_pair: float) -> Preset:
    # A quarter of the GPU stays free for the PPO policy, its rollouts and the
    # allocator; the reward trainer's planner sizes minibatches to the rest.
    budget = f"{int(0.75 * gib)}GiB"
    return Preset(
        named_config=named_config,
        changes={
            "reward_trainer_kwargs": {"minibatch_size": None, "memory_budget": budget}
        },
        description=(
            f"`{named_config}` on a {gib} GB GPU: `memory_budget` {budget}; the "
            f"planner sizes minibatches to it (about {pairs} pairs of "
            f"{per_pair} GiB of activations)"
        ),
    )


QUICKSTART = Preset(
    named_config="atari_pong",
    changes=dict(
        # Two rounds (imitation adds one for the initial pairs): 2 x 2,048 agent
        # steps, 150 + 150 pairs, 6 epochs over all pairs so far in each.
        total_timesteps=2048,
        num_iterations=1,
        total_comparisons=300,
        initial_comparison_frac=0.5,
        initial_epoch_multiplier=1,
        # Half an episode: most fragments of a near-random agent hold a point.
        fragment_length=50,
        # Labels by the true return, ties 0.5 (a softmax sample errs 1 in 4).
        gatherer_kwargs=dict(temperature=0),
        environment=dict(max_episode_steps=100, parallel=False),
        rl=dict(rl_kwargs=dict(n_epochs=1)),
        # A CnnRewardNet that strides (84 -> 42 -> 21): 18 times cheaper on a CPU;
        # it sees the frame after each step (where a point is lost), not the action.
        reward=dict(
            net_kwargs=dict(
                stride=2,
                padding=1,
                hid_channels=(16, 16),
                use_action=False,
                use_next_state=True,
            )
        ),
        reward_trainer_kwargs=dict(
            epochs=6, batch_size=32, minibatch_size=8, lr=1.5e-3
        ),
        policy_evaluation=dict(n_episodes_eval=8),
        held_out_pairs=200,  # the accuracy printed at the end
        seed=0,  # sacred would draw one: the same command, the same result
    ),
    description=(
        "The quickstart: Pong frames, a strided `CnnRewardNet`, batches of 32 "
        "pairs in minibatches of 8; minutes on a laptop CPU"
    ),
)

PRESETS: Dict[str, Preset] = {
    "pong_cpu_quickstart": QUICKSTART,
    "pong_16gb": _gpu("atari_pong", 16, 32, 0.358),
    "pong_24gb": _gpu("atari_pong", 24, 48, 0.358),
    "pong_40gb": _gpu("atari_pong", 40, 80, 0.358),
    "pong_80gb": _gpu("atari_pong", 80, 128, 0.358),
    "pong_unwrapped_16gb": _gpu("atari_pong_unwrapped", 16, 7, 1.678),
    "pong_unwrapped_24gb": _gpu("atari_pong_unwrapped", 24, 10, 1.678),
    "pong_unwrapped_40gb": _gpu("atari_pong_unwrapped", 40, 17, 1.678),
    "pong_unwrapped_80gb": _gpu("atari_pong_unwrapped", 80, 30, 1.678),
}


def render(preset: Preset) -> str:
    """The JSON text of ``preset`` (sacred's format: classes as ``py/type``)."""
    # sacred writes config files only to a path: a scratch folder, not the cwd.
    with tempfile.TemporaryDirectory(prefix="presets-") as scratch:
        path = pathlib.Path(scratch) / "preset.json"
        save_config_file(preset.config(), str(path))
        return path.read_text() + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Rewrites the presets, or prints the README table with ``--table`` (``argv``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table", action="store_true")
    parser.add_argument(
        "--dir",
        type=pathlib.Path,
        default=CONFIGS_DIR if CONFIGS_DIR.is_dir() else None,
        help="where to write NAME.json (default: the checkout's configs/)",
    )
    args = parser.parse_args(argv)
    if not args.table and args.dir is None:
        parser.error("--dir is required outside a checkout of the repository")
    if args.table:
        print("| preset | batch / minibatch or budget | host frames (GiB) | what for |")
        print("|---|---|---|---|")
        for name, preset in PRESETS.items():
            config = preset.config()
            kwargs = config["reward_trainer_kwargs"]
            split = kwargs.get("memory_budget") or kwargs["minibatch_size"]
            sizes = f"{kwargs['batch_size']} / {split}"
            host = config_host_memory_bytes(config)["total"] / 2**30
            print(
                f"| `configs/{name}.json` | {sizes} | {host:.1f} | "
                f"{preset.description} |"
            )
        return
    args.dir.mkdir(exist_ok=True)
    for name, preset in PRESETS.items():
        (args.dir / f"{name}.json").write_text(render(preset))
    print(json.dumps(sorted(PRESETS)))


if __name__ == "__main__":  # pragma: no cover
    main()
