r"""What one preference checkpoint costs at ``atari_pong``'s sizes, part by part.

The sizes are the ``atari_pong`` named config's (``fragment_length=100``,
``total_comparisons=5000`` over ``num_iterations=100``, 8 environments, SB3's PPO
with ``ActorCriticCnnPolicy``) and the defaults of imitation it keeps
(``initial_comparison_frac=0.1``, the hyperbolic query schedule). The schedule
says how many pairs each iteration gathers: the store is filled with those of the
first iterations until it holds ``--pairs`` (2,500: after iteration 37 of 100),
then each of ``--repeats`` checkpoints appends the next iteration's pairs. Pairs
are 84x84x4 uint8 frame stacks of random frames in SB3's ``VecFrameStack`` layout
(the store keeps 104 frames a fragment), random actions and preferences: what is
written does not depend on what the frames show.

Each checkpoint is a real :func:`imitation_accum.io.run_checkpoint.write` in a run
directory under ``--work-dir``, its parts timed inside it as
``ResumablePreferenceComparisons`` writes them:

- the preferences: ``PreferenceDataset.append_to`` the run's store (new rows
  written, hashed and ``fsync``-ed; the store's manifest);
- ``agent.zip``: ``run_state.save_agent`` of the PPO agent on 8 masked Pong
  environments (after one update of 1,024 steps, so that its Adam state exists);
- ``environments.pkl``: ``run_state.save_environments`` of those environments,
  where they pickle;
- ``state.pt``: ``th.save`` of the reward trainer's state (``CnnRewardNet`` with
  ``RunningNorm`` output normalization, as ``atari_pong``; Adam state after one
  step) and the generators;

and the whole write (also the SHA-256 of ``agent.zip`` and ``state.pt``,
``checkpoint.json``, ``fsync``, rename, removal of the older checkpoint). Against
it: what checkpoint format 1 did with the same dataset, ``PreferenceDataset.save``
into a new directory (the whole store, ``fsync``-ed). Also timed: the store's first
append (every pair, as when a store begins) and what a resume reads,
``PreferenceDataset.open_committed`` (every committed byte hashed; page cache warm).

Usage::

    python experiments/bench_checkpoint_cost.py  # docs/results/
    python experiments/bench_checkpoint_cost.py --quick --out-dir /tmp/bcc  # no figures

Disk: the store and, for a moment, its format-1 copy (7.4 GB for 2,500 pairs).
"""

import argparse
import dataclasses
import os
import pathlib
import shutil
import statistics
import tempfile
import time
from typing import Any, Dict, List, Tuple

import numpy as np
import torch as th

import _results
from frame_store_verify import make_pairs

MIB = 2**20


def schedule_of(config: Dict[str, Any]) -> List[int]:
    """Pairs gathered per iteration, as ``ResumablePreferenceComparisons.train``."""
    from imitation.algorithms import preference_comparisons as pc
    from imitation.util import util

    total, iterations = config["total_comparisons"], config["num_iterations"]
    initial = int(total * 0.1)  # imitation's initial_comparison_frac
    hyperbolic = np.vectorize(pc.QUERY_SCHEDULES["hyperbolic"])
    probs = hyperbolic(np.linspace(0, 1, iterations))
    probs = probs / np.sum(probs)
    return [initial, *util.oric(probs * (total - initial)).tolist()]


def make_agent(config: Dict[str, Any], n_envs: int, steps: int):
    """PPO as ``atari_pong`` builds it, after one update; and its seconds."""
    import ale_py  # noqa: F401  (registers the ALE ids)
    from imitation.data import wrappers
    from imitation.util import util
    from stable_baselines3 import PPO

    from imitation_accum.envs import atari

    atari.register_envs()
    environment = config["environment"]
    venv = util.make_vec_env(
        environment["gym_id"],
        rng=np.random.default_rng(0),
        n_envs=n_envs,
        max_episode_steps=environment["max_episode_steps"],
        post_wrappers=[lambda env, _: wrappers.RolloutInfoWrapper(env)],
    )
    rl = config["rl"]
    agent = PPO(
        config["policy"]["policy_cls"],
        venv,
        n_steps=steps // n_envs,
        seed=0,
        device="cpu",
        **{**rl["rl_kwargs"], "batch_size": min(rl["rl_kwargs"]["batch_size"], steps)},
    )
    start = time.perf_counter()
    agent.learn(total_timesteps=steps)
    return agent, time.perf_counter() - start


def make_reward_trainer():
    """The reward trainer of ``atari_pong``, its Adam state after one step."""
    from gymnasium import spaces
    from imitation.algorithms import preference_comparisons as pc
    from imitation.rewards import reward_nets
    from imitation.util import networks

    from imitation_accum import CrossEntropyRewardTrainer

    net = reward_nets.CnnRewardNet(
        spaces.Box(0, 255, (84, 84, 4), np.uint8),
        spaces.Discrete(6),
    )
    net = reward_nets.NormalizedRewardNet(net, networks.RunningNorm)
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(0),
        batch_size=128,
        minibatch_size=16,
        epochs=3,
        progress_bar=False,
    )
    sum(p.sum() for p in net.parameters()).backward()
    trainer.optim.step()
    return trainer


def timed(function) -> Tuple[Any, float]:
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def fsynced_size(path: pathlib.Path) -> int:
    with open(path, "rb") as file:
        os.fsync(file.fileno())
    return path.stat().st_size


def checkpoint(
    log_dir: pathlib.Path,
    count: int,
    dataset,
    store,
    agent,
    trainer,
) -> Dict[str, Any]:
    """One checkpoint written as ``ResumablePreferenceComparisons`` writes it."""
    from imitation_accum.io import frame_store, run_checkpoint, run_state
    from imitation_accum.io import training_state as ts

    times: Dict[str, Any] = {}

    def write_files(directory: pathlib.Path) -> Dict[str, Any]:
        def state() -> int:
            saved = {
                "iteration": count,
                "trainer": dataclasses.asdict(ts.capture_state(trainer, epoch=count)),
                "generators": run_state.capture_generators({"trainer": trainer.rng}),
            }
            th.save(saved, directory / "state.pt")
            return fsynced_size(directory / "state.pt")

        def agent_zip() -> int:
            (directory / "agent.zip").write_bytes(run_state.save_agent(agent))
            return fsynced_size(directory / "agent.zip")

        def environments() -> Any:
            shared = {"agent": agent, "policy": agent.policy}
            try:
                saved = run_state.save_environments(agent.get_env(), shared)
            except Exception as error:  # what the checkpoint records then
                return f"not saved ({type(error).__name__}: {error})"
            (directory / "environments.pkl").write_bytes(saved)
            return fsynced_size(directory / "environments.pkl")

        times["state_bytes"], times["state"] = timed(state)
        times["agent_bytes"], times["agent"] = timed(agent_zip)
        times["environments_bytes"], times["environments"] = timed(environments)
        manifest, times["append"] = timed(lambda: dataset.append_to(store))
        sizes = frame_store.committed_bytes(manifest)
        return {
            "preferences": {"store": store.path.name, "manifest": manifest},
            run_checkpoint.SHARED: {
                f"{store.path.name}/{f}": n for f, n in sizes.items()
            },
        }

    _, times["total"] = timed(
        lambda: run_checkpoint.write(
            log_dir,
            count,
            experiment="bench",
            command="bench",
            config={},
            write_files=write_files,
        )
    )
    store.commit()
    return times


def rewrite_whole(dataset, directory: pathlib.Path) -> float:
    """Checkpoint format 1's preferences: the whole store into a new directory."""
    target = directory / "format1" / "preferences"
    _, seconds = timed(lambda: dataset.save(target))
    shutil.rmtree(target.parent)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2500, help="pairs in the store")
    parser.add_argument("--repeats", type=int, default=3, help="checkpoints timed")
    parser.add_argument("--work-dir", type=pathlib.Path, default=None)
    parser.add_argument("--quick", action="store_true")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)

    from imitation_accum import PreferenceDataset
    from imitation_accum.io import frame_store, run_checkpoint
    from imitation_accum.scripts import presets

    config = presets.preference_config("Pong")
    length, n_envs, steps = config["fragment_length"], 8, config["rl"]["batch_size"]
    schedule = schedule_of(config)
    if args.quick:
        args.pairs, args.repeats, length, n_envs, steps = 4, 1, 5, 1, 8
        schedule = [2, 1, 1, 1, 1]
    filled = int(np.argmax(np.cumsum(schedule) >= args.pairs)) + 1  # iterations
    args.pairs = int(np.sum(schedule[:filled]))
    load_before = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, (2048, 84, 84), dtype=np.uint8)
    agent, learn_seconds = make_agent(config, n_envs, steps)
    trainer = make_reward_trainer()

    with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        work_dir = pathlib.Path(work)
        log_dir = work_dir / "run"
        dataset = PreferenceDataset()
        for done in range(0, args.pairs, 50):  # the stacks are 4x the store
            n = min(50, args.pairs - done)
            dataset.push(*make_pairs(rng, n, length, pool))
        store = frame_store.Appender.create(
            run_checkpoint.root(log_dir) / f"preferences.{filled:06d}"
        )
        first = checkpoint(log_dir, filled, dataset, store, agent, trainer)
        store_mib = sum(dataset.nbytes.values()) / MIB
        rows = []
        for i in range(args.repeats):
            new = schedule[filled + i]
            dataset.push(*make_pairs(rng, new, length, pool))
            times = checkpoint(log_dir, filled + i + 1, dataset, store, agent, trainer)
            times.update(
                iteration=filled + i + 1,
                held=len(dataset) - new,
                new=new,
                whole=rewrite_whole(dataset, work_dir),
            )
            rows.append(times)
        manifest = store.manifest
        assert manifest is not None
        _, reopen = timed(
            lambda: PreferenceDataset.open_committed(store.path, manifest, "bench")
        )
        total_mib = sum(e["bytes"] for e in manifest["arrays"].values()) / MIB

    def cells(times: Dict[str, Any]) -> str:
        return (
            f"| {times['iteration']} | {times['held']} | {times['new']} | "
            f"{times['append']:.3f} | {times['whole']:.3f} | {times['agent']:.3f} | "
            f"{times['environments']:.3f} | {times['state']:.3f} | "
            f"{times['total']:.3f} |\n"
        )

    last = rows[-1]
    environments = last["environments_bytes"]
    environments = (
        f"{environments / MIB:.1f} MiB"
        if isinstance(environments, int)
        else environments.replace("|", "\\|")
    )
    median = {
        key: statistics.median(r[key] for r in rows)
        for key in ("append", "whole", "agent", "environments", "state", "total")
    }
    text = (
        "# What one preference checkpoint costs at `atari_pong`'s sizes\n\n"
        f"A store of {args.pairs} pairs ({store_mib:.0f} MiB; the first {filled} "
        f"iterations of `atari_pong`'s schedule), {length}-step fragments of 84x84x4 "
        f"uint8 frame stacks; then {args.repeats} checkpoints, each after the next "
        "iteration's pairs. Seconds, each part timed inside a real "
        "`run_checkpoint.write` (fsync included):\n\n"
        "| iteration | pairs held | new pairs | preferences appended | store "
        "rewritten whole (format 1) | agent.zip | environments.pkl | state.pt | "
        "whole checkpoint (appending) |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        + "".join(cells(r) for r in rows)
        + f"| median | | | {median['append']:.3f} | {median['whole']:.3f} | "
        f"{median['agent']:.3f} | {median['environments']:.3f} | "
        f"{median['state']:.3f} | {median['total']:.3f} |\n\n"
        f"- The store's first append (all {args.pairs} pairs, as when a store "
        f"begins): {first['append']:.3f} s.\n"
        f"- Resuming reads the store once, `open_committed` hashing every "
        f"committed byte ({total_mib:.0f} MiB, page cache warm): {reopen:.3f} s.\n"
        f"- agent.zip {last['agent_bytes'] / MIB:.1f} MiB; state.pt "
        f"{last['state_bytes'] / MIB:.1f} MiB; environments.pkl: "
        f"{environments}.\n"
        f"- The PPO update that built the agent ({steps} steps, "
        f"{n_envs} environments, CPU) took {learn_seconds:.1f} s; an `atari_pong` "
        "iteration trains the agent for 100,000 steps and the reward net for "
        "3 epochs over every pair held (not timed here).\n"
        f"- Load average (1 min) when it began and ended: {load_before:.2f}, "
        f"{os.getloadavg()[0]:.2f}.\n"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench_checkpoint_cost.md"
    path.write_text(_results.with_made_by(text))
    print(path.read_text())


if __name__ == "__main__":
    main()
