"""The JSON presets of the repository's ``configs/`` folder, and how they are made.

A preset is a named config written out whole (so ``with configs/NAME.json`` needs
nothing else) with a few keys changed: a ``memory_budget`` for a GPU's memory, to
which the trainer's planner sizes minibatches (the batch size, and so the result,
is the same for every GPU), or a run small enough for a CPU.
``python -m imitation_accum.scripts.presets`` rewrites them; a test checks that
they match this table.

Activation memory per fragment pair (``fragment_length=100``, imitation's default
``CnnRewardNet``, 2 x 100 transitions; the bytes autograd saves, counted once per
tensor): 0.358 GiB on 84x84x4 frames, 1.678 GiB on raw 210x160x3 frames; the
descriptions say about how many pairs a budget holds.
"""

import argparse
import copy
import dataclasses
import json
import pathlib
import tempfile
from typing import Any, Dict, Mapping, Optional, Sequence

from sacred.config import save_config_file

from imitation_accum.scripts import atari_configs

CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[3] / "configs"


@dataclasses.dataclass(frozen=True)
class Preset:
    """A JSON preset: a named config of an experiment, with some keys changed.

    Args:
        experiment: The experiment module's name.
        named_config: The named config it starts from.
        changes: Keys changed (nested dictionaries are merged).
        description: What it is for (the README's table).
    """

    experiment: str
    named_config: str
    changes: Mapping[str, Any]
    description: str

    def config(self) -> Dict[str, Any]:
        """The whole preset.

        Returns:
            The named config with :attr:`changes` merged in.
        """
        return _merged(_named_config(self.named_config), self.changes)


def _named_config(name: str) -> Dict[str, Any]:
    if name == "atari_pong_unwrapped":
        return atari_configs.preference_config("Pong", raw=True)
    return atari_configs.preference_config(atari_configs.GAMES[name])


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
        experiment="train_preference_comparisons",
        named_config=named_config,
        changes={
            "reward_trainer_kwargs": {"minibatch_size": None, "memory_budget": budget},
        },
        description=(
            f"`{named_config}` on a {gib} GB GPU: `memory_budget` {budget}; the "
            f"planner sizes minibatches to it (about {pairs} pairs of "
            f"{per_pair} GiB of activations)"
        ),
    )


QUICKSTART = Preset(
    experiment="train_preference_comparisons",
    named_config="atari_pong",
    changes=dict(
        total_timesteps=4096,
        num_iterations=2,
        total_comparisons=120,
        initial_comparison_frac=0.04,  # 4 pairs, trained on for 200 epochs first
        fragment_length=25,
        environment=dict(max_episode_steps=100, parallel=False),
        rl=dict(rl_kwargs=dict(n_epochs=1)),
        # A CnnRewardNet that strides (84 -> 42 -> 21): 18 times cheaper on a CPU.
        reward=dict(net_kwargs=dict(stride=2, padding=1)),
        reward_trainer_kwargs=dict(epochs=1, batch_size=32, minibatch_size=8),
        policy_evaluation=dict(n_episodes_eval=8),
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
    """The JSON text of ``preset`` (sacred's format: classes as ``py/type``).

    Args:
        preset: The preset.

    Returns:
        The file's text.
    """
    # sacred writes config files only to a path: a scratch folder, not the cwd.
    with tempfile.TemporaryDirectory(prefix="presets-") as scratch:
        path = pathlib.Path(scratch) / "preset.json"
        save_config_file(preset.config(), str(path))
        return path.read_text() + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Rewrites the presets, or prints the README table with ``--table``.

    Args:
        argv: Arguments (``sys.argv[1:]`` if ``None``).
    """
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
        for name, preset in PRESETS.items():
            config = preset.config()
            kwargs = config["reward_trainer_kwargs"]
            split = kwargs.get("memory_budget") or kwargs["minibatch_size"]
            sizes = f"{kwargs['batch_size']} / {split}"
            host = atari_configs.config_host_memory_bytes(config)["total"] / 2**30
            print(
                f"| `configs/{name}.json` | {sizes} | {host:.1f} | "
                f"{preset.description} |",
            )
        return
    args.dir.mkdir(exist_ok=True)
    for name, preset in PRESETS.items():
        (args.dir / f"{name}.json").write_text(render(preset))
    print(json.dumps(sorted(PRESETS)))


if __name__ == "__main__":  # pragma: no cover
    main()
