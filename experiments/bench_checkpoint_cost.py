r"""What one preference-comparison checkpoint costs at ``atari_pong``'s sizes.

A resumable run's checkpoint (``imitation_accum.preference.resumable``) appends
the pairs gathered since the last checkpoint to the run's frame store, saves the
agent as SB3 does, and writes the reward trainer's state. This times each part
at ``atari_pong``'s sizes, with the page cache as a running job has it:

- the store: a grown store holding ``--held`` pairs of ``--length``-step
  fragments of 84x84x4 frame stacks (random frames, as SB3's ``VecFrameStack``
  lays them out) takes ``--new`` more (``atari_pong``: 5,000 comparisons over
  100 iterations, 50 an iteration), fsync-ed, median of ``--repeats`` appends;
  against it, ``PreferenceDataset.save`` of the same store whole (what each
  checkpoint did before the store grew in place), once;
- the agent: ``run_state.save_agent`` of SB3's PPO with ``CnnPolicy`` on 84x84x4
  frames and Pong's 6 actions, written and fsync-ed (``agent.zip``);
- the reward trainer: ``th.save`` of its state (``CnnRewardNet`` with AdamW's
  moments, as ``state.pt`` holds it), written and fsync-ed.

An ``atari_pong`` iteration, which the checkpoint follows, trains the agent for
100,000 steps and the reward net on the pairs so far; this does not run one.

Usage::

    python experiments/bench_checkpoint_cost.py  # docs/results/bench_checkpoint_cost.md
    python experiments/bench_checkpoint_cost.py --quick --out-dir /tmp/bcc
"""

import argparse
import io
import os
import pathlib
import statistics
import tempfile
import time
from typing import Callable

import numpy as np
import torch as th

import _results
from frame_store_verify import make_pairs

MIB = 2**20


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def directory_bytes(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def push(dataset, rng: np.random.Generator, n_pairs: int, length: int) -> None:
    """Pushes ``n_pairs`` pairs, a hundred at a time (pairs hold their stacks)."""
    for start in range(0, n_pairs, 100):
        dataset.push(*make_pairs(rng, min(100, n_pairs - start), length))


def agent_save(directory: pathlib.Path) -> tuple:
    """Seconds and bytes of a PPO CnnPolicy agent for Pong saved, written, fsync-ed."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common import vec_env

    from imitation_accum.io import run_state

    class Frames(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
        action_space = gym.spaces.Discrete(6)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, False, False, {}

    agent = PPO("CnnPolicy", vec_env.DummyVecEnv([Frames] * 8), n_steps=16, seed=0)
    agent.learn(128)  # the optimizer holds its moments, as in a running job
    path = directory / "agent.zip"

    def write() -> None:
        with open(path, "wb") as file:
            file.write(run_state.save_agent(agent))
            file.flush()
            os.fsync(file.fileno())

    seconds = statistics.median(timed(write) for _ in range(3))
    return seconds, path.stat().st_size


def trainer_state_save(directory: pathlib.Path) -> tuple:
    """Seconds and bytes of the reward trainer's state written and fsync-ed."""
    from gymnasium import spaces
    from imitation.algorithms import preference_comparisons as pc
    from imitation.rewards import reward_nets

    from imitation_accum import CrossEntropyRewardTrainer
    from imitation_accum.io import training_state

    th.manual_seed(0)
    net = reward_nets.CnnRewardNet(
        spaces.Box(0, 255, (84, 84, 4), np.uint8), spaces.Discrete(6)
    )
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(0),
        epochs=1,
        progress_bar=False,
    )
    for group in trainer.optim.param_groups:  # AdamW's moments, as after a step
        for p in group["params"]:
            trainer.optim.state[p] = {
                "step": th.tensor(1.0),
                "exp_avg": th.zeros_like(p),
                "exp_avg_sq": th.zeros_like(p),
            }
    path = directory / "state.pt"

    def write() -> None:
        buffer = io.BytesIO()
        th.save(training_state.capture_state(trainer, epoch=1), buffer)
        with open(path, "wb") as file:
            file.write(buffer.getvalue())
            file.flush()
            os.fsync(file.fileno())

    seconds = statistics.median(timed(write) for _ in range(3))
    return seconds, path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--held", type=int, default=2500, help="pairs in the store")
    parser.add_argument("--new", type=int, default=50, help="pairs a checkpoint adds")
    parser.add_argument("--length", type=int, default=100, help="steps per fragment")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)
    if args.quick:
        args.held, args.new, args.length, args.repeats = 8, 2, 5, 1

    from imitation_accum import PreferenceDataset
    from imitation_accum.io import frame_store

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        directory = pathlib.Path(scratch)
        dataset = PreferenceDataset()
        push(dataset, rng, args.held, args.length)
        store = frame_store.Appender.create(directory / "preferences.000000")
        assert dataset.append_to(store) is not None
        store.commit()
        appends = []
        for _ in range(args.repeats):
            push(dataset, rng, args.new, args.length)
            before = directory_bytes(store.path)

            def append() -> None:
                assert dataset.append_to(store) is not None
                store.commit()

            appends.append((timed(append), directory_bytes(store.path) - before))
        append_s = statistics.median(s for s, _ in appends)
        append_mib = statistics.median(b for _, b in appends) / MIB
        held = len(dataset)
        store_mib = directory_bytes(store.path) / MIB
        whole_s = timed(lambda: dataset.save(directory / "whole"))
        agent_s, agent_bytes = agent_save(directory)
        state_s, state_bytes = trainer_state_save(directory)
    checkpoint_s = append_s + agent_s + state_s
    text = (
        "# What one preference checkpoint costs at `atari_pong`'s sizes\n\n"
        f"A grown store of {held} pairs of {args.length}-step fragments of 84x84x4 "
        f"frame stacks ({store_mib:.0f} MiB) takes {args.new} more pairs (median "
        f"of {args.repeats} appends); the same store written whole, as before the "
        "store grew in place, once. The agent is SB3's PPO with `CnnPolicy` for "
        "Pong; the reward trainer's state is `CnnRewardNet` with AdamW's moments. "
        "Writes are fsync-ed.\n\n"
        "| part | seconds | MiB written |\n|---|---|---|\n"
        f"| store: append {args.new} pairs | {append_s:.3f} | {append_mib:.1f} |\n"
        f"| store: written whole ({held} pairs) | {whole_s:.3f} | {store_mib:.0f} |\n"
        f"| agent (`agent.zip`) | {agent_s:.3f} | {agent_bytes / MIB:.1f} |\n"
        f"| reward trainer (`state.pt`) | {state_s:.3f} | "
        f"{state_bytes / MIB:.1f} |\n"
        f"| checkpoint (append, agent, trainer) | {checkpoint_s:.3f} | "
        f"{append_mib + (agent_bytes + state_bytes) / MIB:.1f} |\n\n"
        f"The append took {append_s / whole_s:.3f} of writing the store whole. An "
        "`atari_pong` iteration (100,000 agent steps and the reward net's "
        "training) was not run here.\n"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_checkpoint_cost.md"
    path.write_text(_results.with_made_by(text))
    print(path.read_text())


if __name__ == "__main__":
    main()
