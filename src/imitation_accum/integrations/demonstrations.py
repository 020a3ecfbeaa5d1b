r"""Demonstrations for AIRL and GAIL (``demonstrations.path``): make, load compactly.

:func:`make_demonstrations` writes them in imitation's format; from the shell::

    python -m imitation_accum.integrations.demonstrations \
        --gym-id imitation_accum/PongNoFrameskip-v4 --episodes 20 --out demos/pong \
        --policy-type ppo --policy-path path/to/model.zip
"""

import argparse
import dataclasses
import pathlib
from typing import Any, List, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import tqdm
from imitation.data import huggingface_utils, rollout, serialize, types
from imitation.policies import serialize as policies_serialize
from imitation.util import util
from stable_baselines3.common import vec_env

from imitation_accum.envs import atari  # noqa: F401  (registers the Atari ids

_ARRAY_FIELDS = ("obs", "acts", "rews")


def _list_array_to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    # One row of a nested-list Arrow column as an array of the stored dtype.
    array = column.combine_chunks()
    shape = [len(array)]
    while pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        lengths = array.value_lengths().to_numpy(zero_copy_only=False)
        if len(lengths) == 0 or (lengths != lengths[0]).any():
            return np.asarray(column.to_pylist()[0])  # ragged: imitation's way
        shape.append(int(lengths[0]))
        array = array.flatten()
    return array.to_numpy(zero_copy_only=False).reshape(shape)[0]


class TrajectoryDatasetSequence(huggingface_utils.TrajectoryDatasetSequence):
    """imitation's ``TrajectoryDatasetSequence``, keeping the saved dtypes.

    Reads Arrow columns as arrays (uint8 frames stay uint8, not Python lists to
    int64); ``patch()`` makes ``imitation.data.serialize.load`` return it.

    Args:
        dataset: The HuggingFace ``datasets.Dataset`` that
            ``imitation.data.serialize.save`` wrote.
    """

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        self._arrow = self.dataset.with_format("arrow")

    def __getitem__(self, idx: Union[int, slice]) -> Any:
        """The trajectory at ``idx`` (a list of them for a slice)."""
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"trajectory {idx} of {len(self)}")
        row = self._arrow[idx]
        fields = {
            name: _list_array_to_numpy(row.column(name))
            for name in _ARRAY_FIELDS
            if name in row.column_names
        }
        # Infos decode lazily, as in imitation (which passes the same list type).
        infos = huggingface_utils._LazyDecodedList(row.column("infos")[0].as_py())
        return self._trajectory_class(
            **fields,
            infos=infos,  # type: ignore[arg-type]
            terminal=row.column("terminal")[0].as_py(),
        )


def rollout_demonstrations(
    venv: vec_env.VecEnv,
    policy: Any,
    *,
    n_episodes: int,
    rng: np.random.Generator,
    progress_bar: bool = True,
) -> List[types.TrajectoryWithRew]:
    """Rolls ``policy`` (as imitation's ``rollout`` takes) out in ``venv``.

    At least ``n_episodes`` complete episodes, ``rng`` ordering them; without their
    per-step ``infos``. ``progress_bar``: a tqdm bar of episodes and steps (stderr).
    """
    enough = rollout.make_sample_until(min_timesteps=None, min_episodes=n_episodes)
    bar = tqdm.tqdm(
        total=n_episodes,
        desc="Demonstrations",
        unit="episode",
        disable=not progress_bar,
    )
    steps = 0

    def sample_until(trajectories: Sequence[types.TrajectoryWithRew]) -> bool:
        # imitation calls this once per step of the venv, with the finished episodes.
        nonlocal steps
        steps += 1
        bar.set_postfix_str(f"{steps * venv.num_envs} steps", refresh=False)
        bar.update(min(len(trajectories), n_episodes) - bar.n)  # refresh throttled
        return enough(trajectories)

    with bar:
        trajectories = rollout.generate_trajectories(
            policy, venv, sample_until, rng=rng, deterministic_policy=False
        )
    return [dataclasses.replace(traj, infos=None) for traj in trajectories]


def make_demonstrations(
    path: Union[str, pathlib.Path],
    *,
    gym_id: str,
    n_episodes: int,
    policy_type: str = "random",
    policy_path: Optional[str] = None,
    max_episode_steps: Optional[int] = None,
    seed: int = 0,
    progress_bar: bool = True,
) -> Sequence[types.TrajectoryWithRew]:
    """Rolls a policy out in ``gym_id`` (built as imitation builds it) and saves it.

    Args:
        path: Where to save (a directory, imitation's format).
        gym_id: The environment (``environment.gym_id`` of the training run).
        n_episodes: Minimum number of complete episodes.
        policy_type: imitation's policy type (``"random"``, ``"ppo"``, ...).
        policy_path: The saved policy for ``"ppo"`` or ``"sac"``.
        max_episode_steps: The fixed horizon; ``None`` keeps the environment's.
        seed: Seeds the environment and the rollout.
        progress_bar: Show episodes and steps done (tqdm, on stderr).

    Returns:
        The saved trajectories.
    """
    rng = np.random.default_rng(seed)
    venv = util.make_vec_env(
        gym_id, rng=rng, n_envs=1, max_episode_steps=max_episode_steps
    )
    try:
        loader_kwargs = {} if policy_path is None else {"path": policy_path}
        policy = policies_serialize.load_policy(policy_type, venv, **loader_kwargs)
        trajectories = rollout_demonstrations(
            venv, policy, n_episodes=n_episodes, rng=rng, progress_bar=progress_bar
        )
    finally:
        venv.close()
    serialize.save(path, trajectories)
    return trajectories


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Command line for :func:`make_demonstrations` (``argv``: ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(
        prog="python -m imitation_accum.integrations.demonstrations",
        description="Rolls out a policy and saves its episodes in imitation's "
        "format, for train_adversarial's demonstrations.source=local "
        "demonstrations.path=OUT (see docs/adversarial.md).",
    )
    parser.add_argument(
        "--gym-id", required=True, help="the environment (environment.gym_id)"
    )
    parser.add_argument(
        "--out", dest="path", required=True, help="where to save (a folder)"
    )
    parser.add_argument(
        "--episodes", dest="n_episodes", type=int, default=10, help="default: 10"
    )
    parser.add_argument(
        "--policy-type",
        default="random",
        help="imitation's policy types: ppo, sac (with --policy-path), random, "
        "zero (default: random)",
    )
    parser.add_argument(
        "--policy-path", default=None, help="an SB3 model.zip or a folder holding one"
    )
    parser.add_argument(
        "--max-episode-steps",
        type=int,
        default=None,
        help="the horizon (environment.max_episode_steps); default: the id's",
    )
    parser.add_argument("--seed", type=int, default=0, help="default: 0")
    parser.add_argument(
        "--no-progress", dest="progress_bar", action="store_false", help="no bar"
    )
    args = parser.parse_args(argv)
    trajectories = make_demonstrations(**vars(args))
    steps = sum(len(traj) for traj in trajectories)
    print(f"Saved {len(trajectories)} episodes ({steps} transitions) to {args.path}")


if __name__ == "__main__":  # pragma: no cover
    main()
