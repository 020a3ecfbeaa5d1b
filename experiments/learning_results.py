r"""Does the package learn what imitation learns, at every minibatch size?

Two parts, every run in a fresh process:

1. **MLP rows** (``seals/CartPole-v0``, ``Pendulum-v1``): imitation 1.0.1's own
   ``train_preference_comparisons`` experiment, unchanged (the whole batch in one
   optimizer step, as upstream computes it), against this package's
   (``imitation_accum.scripts.train_preference_comparisons``) with the same named
   config and budgets, at the whole batch, a ``minibatch_size`` that does not
   divide ``batch_size`` and a ``memory_budget`` that holds three quarters of a
   pair (a pair's two fragments do not fit in one chunk), so that every step runs
   two passes (read back from the run's log). Per run: the
   agent's ground-truth return after training on the learned reward (the
   experiment's own ``imit_stats``, ``monitor_return_mean``) and the final reward
   net's accuracy on held-out pairs: fragments of fresh rollouts of the trained
   agent and of a random policy, never trained on, labelled by their true return;
   tied pairs are left out.
2. **Pong offline row**: real ``PongNoFrameskip-v4`` frames (this package's
   ``imitation_accum/PongNoFrameskip-v4``: score masked, 84x84x4) of a random
   agent, fragments long enough to hold points, preferences by true return (ties
   left out), saved as a frame store; ``train_reward_model`` trains a
   ``CnnRewardNet`` at minibatch sizes 4 and 16, the whole batch, and under a
   two-pass ``memory_budget``, and reports the held-out accuracy after each epoch.

Usage::

    python experiments/learning_results.py                 # docs/results/
    python experiments/learning_results.py --quick         # output/experiments/
    python experiments/learning_results.py --parts pong --pong-seeds 2
    python experiments/learning_results.py --reuse mlp.log pong/learning_results.json

``--jobs`` runs go at a time (each a fresh process of ``--threads`` threads). Each
run's row is printed as it ends, so ``--reuse`` can assemble a table from parts run
separately, or from a run cut short. Writes ``learning_results.md`` (tables),
``learning_results.json`` (rows) and ``learning_results.png`` (plot) to the output
directory (``--out-dir``).
``--quick`` runs tiny budgets, one seed: it checks the script works.
"""

import argparse
import concurrent.futures
import contextlib
import csv
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

import _results

RESULT_PREFIX = "LEARNING_RESULT "
UPSTREAM = "imitation 1.0.1"

#: The MLP environments: imitation's named config and budgets (same on both sides).
MLP_ENVS: Dict[str, Dict[str, Any]] = {
    "seals_cartpole": dict(
        gym_id="seals/CartPole-v0",
        config=dict(
            total_timesteps=30_000,
            total_comparisons=200,
            num_iterations=5,
            fragment_length=50,
            # Episodes of 100 steps, not 500: a random policy's pole falls within
            # about 20 steps, and in 500-step episodes nearly every fragment then
            # holds no reward (tied pairs), from which no reward is learnt.
            environment=dict(max_episode_steps=100),
        ),
    ),
    "pendulum": dict(
        gym_id="Pendulum-v1",
        config=dict(
            total_timesteps=40_000,
            total_comparisons=200,
            num_iterations=5,
            fragment_length=50,
            # PPO as RL Baselines3 Zoo tunes it for Pendulum-v1 (its 4 x 1024 steps
            # per update as 8 x 128): SB3's defaults, which imitation's named config
            # keeps, do not learn Pendulum in this budget.
            rl=dict(
                batch_size=1024,
                rl_kwargs=dict(
                    batch_size=64,
                    n_epochs=10,
                    gae_lambda=0.95,
                    gamma=0.9,
                    learning_rate=1e-3,
                    clip_range=0.2,
                    use_sde=True,
                    sde_sample_freq=4,
                    ent_coef=0.0,
                ),
            ),
        ),
    ),
}
#: Settings shared by every MLP run (both implementations).
MLP_COMMON: Dict[str, Any] = dict(
    environment=dict(parallel=False),  # 8 environments in one process
    policy_evaluation=dict(n_episodes_eval=10),
)
MLP_BATCH = 32  # imitation's default batch_size
MLP_MINIBATCH = 5  # does not divide MLP_BATCH (imitation 1.0.1 rejects it)

#: The Pong row's reward net: imitation's CnnRewardNet, strided so that it trains
#: on two shared CPU cores (3x3 kernels at stride 3 still see every pixel, at a
#: fifth of stride 1's positions per layer).
PONG_NET_KWARGS: Dict[str, Any] = dict(
    use_action=False,
    use_next_state=True,
    hid_channels=(16, 16),
    stride=3,
    padding=1,
)
PONG_ID = "imitation_accum/PongNoFrameskip-v4"
PONG_TARGET = 0.85  # the held-out accuracy target for the Pong row


def _merged(base: Mapping[str, Any], updates: Mapping[str, Any]) -> Dict[str, Any]:
    """``base`` updated by ``updates``, nested dicts merged key by key (copies)."""
    merged = json.loads(json.dumps(base))
    for key, value in updates.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = json.loads(json.dumps(value))
    return merged


def mlp_config(named_config: str, overrides: Mapping[str, Any]) -> Dict[str, Any]:
    """The config updates of an MLP run (both implementations).

    The common settings, the environment's, then ``overrides`` (``--quick``,
    ``--total-timesteps``, ...).
    """
    return _merged(_merged(MLP_COMMON, MLP_ENVS[named_config]["config"]), overrides)


# --------------------------------------------------------------------------- workers


def _two_pass_steps(log_root: pathlib.Path) -> Tuple[int, int]:
    """(steps that ran two passes, steps logged) from the ``progress.csv`` files."""
    two, total = 0, 0
    for path in log_root.rglob("progress.csv"):
        with open(path, newline="") as file:
            for row in csv.DictReader(file):
                for key, value in row.items():
                    if key and key.endswith("two_pass") and value not in ("", None):
                        total += 1
                        two += float(value) > 0.5
    return two, total


def _predicted_return(net: Any, fragment: Any) -> float:
    """Sum of the reward net's (unnormalized) rewards over a fragment."""
    n = len(fragment.acts)
    dones = np.zeros(n, dtype=bool)
    dones[-1] = bool(fragment.terminal)
    rewards = net.predict(fragment.obs[:-1], fragment.acts, fragment.obs[1:], dones)
    return float(np.sum(rewards, dtype=np.float64))


def pair_accuracy(net: Any, pairs: Sequence[Tuple[Any, Any]]) -> Tuple[float, int]:
    """Share of non-tied pairs the net orders as their true returns do, and their count.

    Raises:
        ValueError: if every pair is tied.
    """
    right, counted = 0, 0
    for first, second in pairs:
        true = float(np.sum(second.rews, dtype=np.float64)) - float(
            np.sum(first.rews, dtype=np.float64)
        )
        if true == 0:
            continue
        predicted = _predicted_return(net, second) - _predicted_return(net, first)
        counted += 1
        right += (predicted > 0) == (true > 0)
    if counted == 0:
        raise ValueError("every held-out pair is tied: no accuracy to report")
    return right / counted, counted


def held_out_pairs(
    gym_id: str, policy: Any, fragment_length: int, n_pairs: int, seed: int
) -> List[Tuple[Any, Any]]:
    """Fragment pairs of fresh rollouts: ``policy``'s and a random policy's."""
    import torch as th
    from imitation.algorithms import preference_comparisons as pc
    from imitation.data import rollout
    from imitation.util import util

    th.manual_seed(seed)  # SB3 samples the policy's actions with torch
    rng = np.random.default_rng(seed)
    venv = util.make_vec_env(gym_id, n_envs=1, rng=rng)
    until = rollout.make_min_episodes(4)
    trajectories = list(rollout.generate_trajectories(policy, venv, until, rng))
    trajectories += rollout.generate_trajectories(None, venv, until, rng)
    venv.close()
    fragmenter = pc.RandomFragmenter(rng=rng, warning_threshold=0)
    return list(fragmenter(trajectories, fragment_length, n_pairs))


def mlp_worker(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """One preference-comparisons run (imitation's or the package's), evaluated."""
    import torch as th
    from stable_baselines3 import PPO

    if spec["impl"] == UPSTREAM:
        from imitation.scripts.train_preference_comparisons import (
            train_preference_comparisons_ex as ex,
        )
    else:
        from imitation_accum.scripts.train_preference_comparisons import (
            train_preference_comparisons_ex as ex,
        )
    env = MLP_ENVS[spec["named_config"]]
    with tempfile.TemporaryDirectory(prefix="learning-results-") as scratch:
        run_dir = pathlib.Path(scratch) / "run"
        updates = mlp_config(spec["named_config"], spec.get("overrides", {}))
        updates["logging"] = dict(log_dir=str(run_dir), log_format_strs=["csv"])
        updates["reward_trainer_kwargs"] = dict(
            epochs=spec["epochs"], **spec["trainer_kwargs"]
        )
        updates["seed"] = spec["seed"]
        start = time.perf_counter()
        run = ex.run(named_configs=[spec["named_config"]], config_updates=updates)
        seconds = time.perf_counter() - start
        result: Mapping[str, Any] = run.result or {}
        stats = result["imit_stats"]
        final = run_dir / "checkpoints" / "final"
        net = th.load(final / "reward_net.pt", weights_only=False, map_location="cpu")
        policy = PPO.load(final / "policy" / "model.zip", device="cpu")
        pairs = held_out_pairs(
            env["gym_id"],
            policy,
            int(updates["fragment_length"]),
            int(spec["held_out_pairs"]),
            seed=10_000 + int(spec["seed"]),
        )
        accuracy, counted = pair_accuracy(net, pairs)
        two, steps = _two_pass_steps(run_dir)
    return dict(
        part="mlp",
        env=spec["named_config"],
        setting=spec["setting"],
        seed=spec["seed"],
        gt_return=float(stats.get("monitor_return_mean", stats["return_mean"])),
        held_out_accuracy=accuracy,
        held_out_pairs=counted,
        train_accuracy=float(result["reward_accuracy"]),
        two_pass_steps=two,
        logged_steps=steps,
        seconds=seconds,
        load=os.getloadavg()[0],
    )


def pong_worker(spec: Mapping[str, Any]) -> Dict[str, Any]:
    """One ``train_reward_model`` run on the Pong store, per-epoch held-out figures."""
    from imitation_accum.scripts.train_reward_model import train_reward_model_ex

    with tempfile.TemporaryDirectory(prefix="learning-results-") as scratch:
        run_dir = pathlib.Path(scratch) / "run"
        kwargs = dict(
            batch_size=spec["batch_size"],
            epochs=spec["epochs"],
            lr=spec["lr"],
            progress_bar=False,
            **spec["trainer_kwargs"],
        )
        start = time.perf_counter()
        run = train_reward_model_ex.run(
            named_configs=["atari_pong"],
            config_updates=dict(
                dataset_path=spec["store"],
                held_out_fraction=spec["held_out_fraction"],
                reward_trainer_kwargs=kwargs,
                reward=dict(net_kwargs=dict(spec["net_kwargs"])),
                logging=dict(log_dir=str(run_dir), log_format_strs=["csv"]),
                seed=spec["seed"],
                checkpoint_interval=-1,
            ),
        )
        seconds = time.perf_counter() - start
        two, steps = _two_pass_steps(run_dir)
    history = (run.result or {})["held_out"]
    return dict(
        part="pong",
        setting=spec["setting"],
        seed=spec["seed"],
        accuracy=[float(h["accuracy"]) for h in history],
        loss=[float(h["loss"]) for h in history],
        two_pass_steps=two,
        logged_steps=steps,
        seconds=seconds,
        load=os.getloadavg()[0],
    )


# --------------------------------------------------------------------- the parent


def run_worker(kind: str, spec: Mapping[str, Any], threads: int) -> Dict[str, Any]:
    """Runs one worker in a fresh process and returns its result row."""
    env = dict(os.environ)
    src = str(_results.REPO_ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (src, env.get("PYTHONPATH", "")) if p
    )
    env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [sys.executable, __file__, "--worker", kind, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX) :]))
    raise RuntimeError(
        f"worker {kind} {spec.get('setting')} seed {spec.get('seed')} failed "
        f"(exit {done.returncode}):\n{done.stderr[-4000:]}"
    )


def _mlp_budget(named_config: str, fragment_length: int) -> int:
    """A ``memory_budget`` that holds 3/4 of a pair: two passes every step."""
    import gymnasium as gym
    from imitation.rewards import reward_nets
    from imitation.scripts.ingredients import reward as reward_ingredient
    from imitation.util import networks

    env = gym.make(MLP_ENVS[named_config]["gym_id"])
    env.close()
    net = reward_ingredient._make_reward_net(
        env,  # type: ignore[arg-type]  # only its spaces are read
        reward_nets.BasicRewardNet,
        {"normalize_input_layer": networks.RunningNorm},
        networks.RunningNorm,
    )
    return _splitting_budget(net, env, fragment_length)


def _splitting_budget(net: Any, env: Any, fragment_length: int) -> int:
    # The trainer's own probe, on one pair of this shape. Chunks of 3/4 of a pair
    # split every pair (two passes) in fewer chunks than half a fragment would.
    from imitation.algorithms import preference_comparisons as pc
    from imitation.data.types import TrajectoryWithRew

    from imitation_accum import CrossEntropyRewardTrainer, PreferenceDataset
    from imitation_accum.preference import pair_table

    def fragment() -> TrajectoryWithRew:
        return TrajectoryWithRew(
            obs=np.stack(
                [env.observation_space.sample() for _ in range(fragment_length + 1)]
            ),
            acts=np.stack([env.action_space.sample() for _ in range(fragment_length)]),
            infos=None,
            terminal=False,
            rews=np.zeros(fragment_length, np.float32),
        )

    dataset = PreferenceDataset()
    dataset.push([(fragment(), fragment())], np.array([0.5], np.float32))
    trainer = CrossEntropyRewardTrainer(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(0),
        progress_bar=False,
    )
    trainer._task.refresh_device()
    profile = trainer._profile(pair_table.read_preferences(dataset))
    if fragment_length < 2:
        raise ValueError(
            f"fragment_length={fragment_length}: two passes need 2 or more"
        )
    transitions = fragment_length + fragment_length // 2
    return int(profile.chunk_bytes(transitions, transitions))


def mlp_settings(
    named_config: str, overrides: Mapping[str, Any]
) -> List[Tuple[str, str, Dict[str, Any]]]:
    """(setting, implementation, reward_trainer_kwargs) of the MLP rows."""
    length = int(mlp_config(named_config, overrides)["fragment_length"])
    budget = _mlp_budget(named_config, length)
    return [
        (UPSTREAM, UPSTREAM, {}),
        ("package, whole batch", "package", {}),
        (
            f"package, minibatch {MLP_MINIBATCH}",
            "package",
            {"minibatch_size": MLP_MINIBATCH},
        ),
        ("package, two passes", "package", {"memory_budget": budget}),
    ]


def mlp_specs(args: argparse.Namespace) -> List[Tuple[str, Dict[str, Any]]]:
    """Every MLP run's ("mlp", spec), seed by seed."""
    specs = []
    settings = {env: mlp_settings(env, args.mlp_overrides) for env in args.envs}
    # Seed by seed, so that a run cut short leaves whole seeds of every environment.
    for seed in range(args.seeds):
        for named_config in args.envs:
            for setting, impl, trainer_kwargs in settings[named_config]:
                spec = dict(
                    named_config=named_config,
                    setting=setting,
                    impl=impl,
                    seed=seed,
                    trainer_kwargs=trainer_kwargs,
                    held_out_pairs=args.held_out_pairs,
                    overrides=args.mlp_overrides,
                    epochs=args.mlp_epochs,
                )
                specs.append(("mlp", spec))
    return specs


def _pong_fragments(steps: int, length: int, seed: int) -> Tuple[Any, np.ndarray]:
    """A random agent's trajectory of masked Pong, and each start's true return."""
    import gymnasium as gym
    from imitation.data import types

    from imitation_accum.envs import atari  # noqa: F401  (registers PONG_ID)

    env = gym.make(PONG_ID, max_episode_steps=steps + 1)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    observations, actions, rewards = [obs], [], []
    for _ in range(steps):
        action = env.action_space.sample()
        obs, reward, _, _, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(reward)
    env.close()
    trajectory = types.TrajectoryWithRew(
        obs=np.stack(observations),
        acts=np.array(actions),
        infos=None,
        terminal=False,
        rews=np.array(rewards, dtype=np.float32),
    )
    cumulative = np.concatenate([[0.0], np.cumsum(trajectory.rews, dtype=np.float64)])
    return trajectory, cumulative[length:] - cumulative[:-length]


def make_pong_store(
    path: pathlib.Path, n_pairs: int, length: int, steps: int, seed: int
) -> Dict[str, Any]:
    """Saves ``n_pairs`` non-tied pairs of ``length``-step Pong fragments."""
    from imitation.data import types

    from imitation_accum import PreferenceDataset

    trajectory, returns = _pong_fragments(steps, length, seed)
    rng = np.random.default_rng(seed)
    pairs: List[Tuple[Any, Any]] = []
    preferences: List[float] = []

    def cut(start: int) -> types.TrajectoryWithRew:
        return types.TrajectoryWithRew(
            obs=trajectory.obs[start : start + length + 1],
            acts=trajectory.acts[start : start + length],
            infos=None,
            terminal=False,
            rews=trajectory.rews[start : start + length],
        )

    while len(pairs) < n_pairs:
        first, second = (int(s) for s in rng.integers(0, len(returns), 2))
        if returns[first] == returns[second]:
            continue  # ties left out: every pair has a right answer
        pairs.append((cut(first), cut(second)))
        preferences.append(float(returns[first] > returns[second]))
    dataset = PreferenceDataset()
    dataset.push(pairs, np.array(preferences, np.float32))
    dataset.save(path, env_id=PONG_ID)
    values, counts = np.unique(returns, return_counts=True)
    return dict(
        steps=steps,
        points=int(np.sum(trajectory.rews != 0)),
        fragment_returns={str(v): int(c) for v, c in zip(values, counts)},
    )


def pong_budget(length: int) -> int:
    """A ``memory_budget`` that holds 3/4 of a pair of Pong fragments (two passes)."""
    import gymnasium as gym
    from imitation.rewards import reward_nets

    from imitation_accum.envs import atari  # noqa: F401  (registers PONG_ID)

    env = gym.make(PONG_ID)
    env.close()
    net = reward_nets.CnnRewardNet(
        env.observation_space, env.action_space, **PONG_NET_KWARGS
    )
    return _splitting_budget(net, env, length)


def pong_specs(
    args: argparse.Namespace, workdir: pathlib.Path
) -> Tuple[Dict[str, Any], List[Tuple[str, Dict[str, Any]]]]:
    """The Pong row's store (made in ``workdir``), its data and ("pong", spec)s."""
    store = workdir / "pong.store"
    data = make_pong_store(
        store, args.pong_pairs, args.pong_length, args.pong_steps, seed=0
    )
    print(json.dumps({"pong_data": data}), flush=True)
    data.update(_pong_settings(args))
    settings = [
        ("minibatch 4", {"minibatch_size": 4}),
        ("minibatch 16", {"minibatch_size": 16}),
        (f"whole batch ({args.pong_batch})", {}),
        ("two passes", {"memory_budget": pong_budget(args.pong_length)}),
    ]
    specs = []
    for seed in range(args.pong_seeds):
        for setting, trainer_kwargs in settings:
            spec = dict(
                setting=setting,
                seed=seed,
                store=str(store),
                trainer_kwargs=trainer_kwargs,
                batch_size=args.pong_batch,
                epochs=args.pong_epochs,
                lr=args.pong_lr,
                held_out_fraction=args.pong_held_out,
                net_kwargs=PONG_NET_KWARGS,
            )
            specs.append(("pong", spec))
    return data, specs


def run_workers(
    specs: Sequence[Tuple[str, Mapping[str, Any]]], jobs: int, threads: int
) -> List[Dict[str, Any]]:
    """Runs every spec in a fresh process, ``jobs`` at a time; rows in spec order.

    Each row is printed as its run ends, so that a run cut short leaves the rows
    it finished in its output (``--reuse`` reads them back).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_worker, kind, spec, threads) for kind, spec in specs]
        try:
            for future in concurrent.futures.as_completed(futures):
                print(json.dumps(future.result()), flush=True)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the runs under way still end
            raise
        return [future.result() for future in futures]


def _pong_settings(args: argparse.Namespace) -> Dict[str, Any]:
    return dict(
        pairs=args.pong_pairs,
        fragment_length=args.pong_length,
        batch_size=args.pong_batch,
        epochs=args.pong_epochs,
        lr=args.pong_lr,
        held_out_fraction=args.pong_held_out,
    )


# -------------------------------------------------------------------- the report


def _fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"


def mlp_tables(rows: List[Dict[str, Any]]) -> Tuple[str, List[Dict[str, Any]]]:
    """Per-run table, summary table (median and range per setting) and the summary."""
    lines = [
        "| environment | setting | seed | return | held-out accuracy (pairs) "
        "| two-pass log rows / log rows | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['setting']} | {r['seed']} | {_fmt(r['gt_return'], 1)} "
            f"| {_fmt(r['held_out_accuracy'])} ({r['held_out_pairs']}) "
            f"| {r['two_pass_steps']} / {r['logged_steps']} | {r['seconds']:.0f} |"
        )
    summary = []
    for env in dict.fromkeys(r["env"] for r in rows):
        mine = [r for r in rows if r["env"] == env]
        upstream = [r["gt_return"] for r in mine if r["setting"] == UPSTREAM]
        for setting in dict.fromkeys(r["setting"] for r in mine):
            runs = [r for r in mine if r["setting"] == setting]
            returns = [r["gt_return"] for r in runs]
            accuracies = [r["held_out_accuracy"] for r in runs]
            median = statistics.median(returns)
            summary.append(
                dict(
                    env=env,
                    setting=setting,
                    runs=len(runs),
                    return_median=median,
                    return_min=min(returns),
                    return_max=max(returns),
                    accuracy_median=statistics.median(accuracies),
                    accuracy_min=min(accuracies),
                    accuracy_max=max(accuracies),
                    within_upstream_range=bool(
                        upstream and min(upstream) <= median <= max(upstream)
                    ),
                    return_median_minus_upstream=(
                        median - statistics.median(upstream) if upstream else None
                    ),
                )
            )
    lines += [
        "",
        "| environment | setting | runs | return: median [min, max] "
        "| median - upstream's median | within upstream's range "
        "| held-out accuracy: median [min, max] |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        diff = s["return_median_minus_upstream"]
        lines.append(
            f"| {s['env']} | {s['setting']} | {s['runs']} "
            f"| {_fmt(s['return_median'], 1)} [{_fmt(s['return_min'], 1)}, "
            f"{_fmt(s['return_max'], 1)}] | {'' if diff is None else _fmt(diff, 1)} "
            f"| {'yes' if s['within_upstream_range'] else 'no'} "
            f"| {_fmt(s['accuracy_median'])} [{_fmt(s['accuracy_min'])}, "
            f"{_fmt(s['accuracy_max'])}] |"
        )
    package = [s for s in summary if s["setting"] != UPSTREAM]
    if package:
        largest = max(package, key=lambda s: abs(s["return_median_minus_upstream"]))
        lines += [
            "",
            f"Largest difference of a median return from upstream's: "
            f"{_fmt(largest['return_median_minus_upstream'], 1)} "
            f"({largest['env']}, {largest['setting']}); every package median within "
            f"upstream's seed range: "
            f"{'yes' if all(s['within_upstream_range'] for s in package) else 'no'}.",
        ]
        same_seed = _same_seed_differences(
            [r for r in rows if r["setting"] != UPSTREAM],
            ("gt_return", "held_out_accuracy"),
        )
        lines += [
            "",
            "Largest difference between the package's settings at the same seed "
            "(the same update up to round-off, which training amplifies): return "
            f"{_fmt(same_seed['gt_return'], 1)}, held-out accuracy "
            f"{_fmt(same_seed['held_out_accuracy'])}.",
        ]
    return "\n".join(lines), summary


def _same_seed_differences(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> Dict[str, float]:
    """Per key, the largest max - min over the rows of one environment and seed."""
    groups: Dict[Tuple[Any, Any], List[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("env"), r["seed"]), []).append(r)
    return {
        key: max(
            (max(r[key] for r in g) - min(r[key] for r in g) for g in groups.values()),
            default=0.0,
        )
        for key in keys
    }


def pong_tables(pong: Dict[str, Any]) -> Tuple[str, List[Dict[str, Any]]]:
    """Per-run per-epoch table and a summary of the final and per-epoch spreads."""
    rows = pong["rows"]
    epochs = max(len(r["accuracy"]) for r in rows)
    head = " | ".join(f"epoch {e + 1}" for e in range(epochs))
    lines = [
        f"| setting | seed | {head} | two-pass log rows / log rows | seconds |",
        "|---|---|" + "---|" * epochs + "---|---|",
    ]
    for r in rows:
        cells = " | ".join(_fmt(a) for a in r["accuracy"])
        lines.append(
            f"| {r['setting']} | {r['seed']} | {cells} "
            f"| {r['two_pass_steps']} / {r['logged_steps']} | {r['seconds']:.0f} |"
        )
    summary = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        final = [r["accuracy"][-1] for r in rows if r["setting"] == setting]
        summary.append(
            dict(
                setting=setting,
                runs=len(final),
                final_median=statistics.median(final),
                final_min=min(final),
                final_max=max(final),
            )
        )
    # Per epoch: the largest gap between settings' means against the seed spread.
    seeds = sorted({r["seed"] for r in rows})
    gaps, spreads = [], []
    for epoch in range(epochs):
        by_setting = {
            s["setting"]: [
                r["accuracy"][epoch] for r in rows if r["setting"] == s["setting"]
            ]
            for s in summary
        }
        means = [float(np.mean(v)) for v in by_setting.values()]
        gaps.append(max(means) - min(means))
        per_seed = [
            [r["accuracy"][epoch] for r in rows if r["seed"] == seed] for seed in seeds
        ]
        seed_means = [float(np.mean(v)) for v in per_seed]
        spreads.append(max(seed_means) - min(seed_means))
    lines += [
        "",
        "| setting | runs | final held-out accuracy: median [min, max] |",
        "|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['setting']} | {s['runs']} | {_fmt(s['final_median'])} "
            f"[{_fmt(s['final_min'])}, {_fmt(s['final_max'])}] |"
        )
    lines += [
        "",
        "| epoch | largest gap between settings' mean accuracy "
        "| seed-to-seed spread (range of seeds' means) |",
        "|---|---|---|",
    ]
    for epoch, (gap, spread) in enumerate(zip(gaps, spreads)):
        lines.append(f"| {epoch + 1} | {_fmt(gap)} | {_fmt(spread)} |")
    widest = int(np.argmax(gaps))
    below = all(gap < spread for gap, spread in zip(gaps, spreads))
    reached = [s["setting"] for s in summary if s["final_median"] >= PONG_TARGET]
    lines += [
        "",
        f"Settings whose median final held-out accuracy is at least {PONG_TARGET}: "
        f"{len(reached)} of {len(summary)}"
        + (f" ({', '.join(reached)})" if reached else "")
        + ". Largest gap between settings' mean accuracy: "
        f"{_fmt(gaps[widest])} (epoch {widest + 1}); below the seed-to-seed spread "
        f"at every epoch: {'yes' if below else 'no'}.",
    ]
    same_seed = max(
        (
            max(r["accuracy"][e] for r in rows if r["seed"] == seed)
            - min(r["accuracy"][e] for r in rows if r["seed"] == seed)
            for seed in seeds
            for e in range(epochs)
            if all(len(r["accuracy"]) > e for r in rows)
        ),
        default=0.0,
    )
    lines += [
        "",
        "Largest difference between settings at the same seed and epoch (the same "
        "update up to round-off, which AdamW amplifies): "
        f"{_fmt(same_seed)}.",
    ]
    for s in summary:
        s["epoch_gaps"] = gaps
        s["epoch_seed_spreads"] = spreads
    return "\n".join(lines), summary


def plot(
    path: pathlib.Path,
    mlp_rows: List[Dict[str, Any]],
    pong: Optional[Dict[str, Any]],
    caption: str,
) -> None:
    """Pong accuracy per epoch, and upstream against package returns per seed."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    envs = list(dict.fromkeys(r["env"] for r in mlp_rows))
    n_panels = len(envs) + (pong is not None)
    fig, axes = plt.subplots(1, max(1, n_panels), figsize=(5 * max(1, n_panels), 4.2))
    axes = np.atleast_1d(axes)
    panel = 0
    if pong is not None:
        ax = axes[panel]
        panel += 1
        settings = list(dict.fromkeys(r["setting"] for r in pong["rows"]))
        for i, setting in enumerate(settings):
            for r in (r for r in pong["rows"] if r["setting"] == setting):
                epochs = np.arange(1, len(r["accuracy"]) + 1)
                # Settings of one seed nearly coincide: styles tell them apart.
                ax.plot(
                    epochs,
                    r["accuracy"],
                    color=f"C{i}",
                    marker="os^D"[i % 4],
                    linestyle=("-", "--", ":", "-.")[i % 4],
                    markersize=7 - 1.5 * (i % 4),
                    alpha=0.8,
                    label=setting if r["seed"] == 0 else None,
                )
        ax.axhline(PONG_TARGET, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("held-out accuracy (non-tied pairs)")
        ax.set_title("Pong, CnnRewardNet (train_reward_model)")
        ax.legend(fontsize=8)
    for env in envs:
        ax = axes[panel]
        panel += 1
        rows = [r for r in mlp_rows if r["env"] == env]
        settings = list(dict.fromkeys(r["setting"] for r in rows))
        for i, setting in enumerate(settings):
            mine = [r for r in rows if r["setting"] == setting]
            offset = (i - (len(settings) - 1) / 2) * 0.15
            ax.scatter(
                [r["seed"] + offset for r in mine],
                [r["gt_return"] for r in mine],
                color=f"C{i}",
                marker="s" if setting == UPSTREAM else "o",
                label=setting,
            )
        ax.set_xlabel("seed")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("ground-truth return of the trained agent")
        ax.set_title(f"{env}: upstream against the package")
        ax.legend(fontsize=8)
    fig.text(0.01, 0.01, caption, fontsize=6, wrap=True)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110, metadata={"Description": caption})
    plt.close(fig)


def _mlp_order(row: Mapping[str, Any]) -> Tuple[int, int, int, int, int]:
    """Environment, seed, then upstream, whole batch, minibatch, two passes."""
    envs = list(MLP_ENVS)
    setting = str(row["setting"])
    return (
        envs.index(row["env"]) if row["env"] in envs else len(envs),
        int(row["seed"]),
        setting != UPSTREAM,
        "two passes" in setting,
        "minibatch" in setting,
    )


def _pong_order(row: Mapping[str, Any]) -> Tuple[int, int, int]:
    """Seed, then minibatch 4, minibatch 16, whole batch, two passes."""
    setting = str(row["setting"])
    minibatch = setting.split()[-1] if setting.startswith("minibatch") else ""
    rank = 2 + ("two passes" in setting) if not minibatch else 0
    return int(row["seed"]), rank, int(minibatch) if minibatch.isdigit() else 0


def write_report(
    out_dir: pathlib.Path,
    args: argparse.Namespace,
    mlp_rows: List[Dict[str, Any]],
    pong: Optional[Dict[str, Any]],
    load: Tuple[float, float],
    seconds: float,
) -> None:
    """Writes ``learning_results.{md,json,png}``."""
    made_by = _results.made_by()
    out_dir.mkdir(parents=True, exist_ok=True)
    # Rows read back from a run's output come in the order the runs ended.
    mlp_rows = sorted(mlp_rows, key=_mlp_order)
    if pong is not None:
        pong = dict(pong, rows=sorted(pong["rows"], key=_pong_order))
    parts = [
        "# Learning results: the package against imitation 1.0.1",
        "",
        f"Load average (1 min) at the start and end: {load[0]:.1f} and {load[1]:.1f}; "
        f"this command took {seconds / 60:.0f} minutes"
        + (" (it ran no part: every part was reused)." if not args.ran else "."),
    ]
    if args.reused:
        parts += ["", "Taken from earlier runs (`--reuse`):", ""]
        parts += [f"- {line}" for line in args.reused]
    rows = [*mlp_rows, *(pong["rows"] if pong else [])]
    loads = [r["load"] for r in rows if "load" in r]
    if loads:
        parts += [
            "",
            f"Load average (1 min) at the end of each run: {min(loads):.1f} to "
            f"{max(loads):.1f} ({len(loads)} of {len(rows)} runs recorded it).",
        ]
    results: Dict[str, Any] = {"mlp": mlp_rows}
    if mlp_rows:
        table, summary = mlp_tables(mlp_rows)
        results["mlp_summary"] = summary
        budgets = {
            env: mlp_config(env, args.mlp_overrides)
            for env in dict.fromkeys(r["env"] for r in mlp_rows)
        }
        parts += [
            "",
            "## MLP rows: train_preference_comparisons, upstream and package",
            "",
            f"Same named config and budget on both sides ({json.dumps(budgets)}), "
            f"`reward_trainer_kwargs.epochs={args.mlp_epochs}`, "
            f"`batch_size={MLP_BATCH}`. Return: "
            "the experiment's `imit_stats` (`monitor_return_mean`, ground truth). "
            "Held-out accuracy: the final reward net on pairs of fragments of fresh "
            "rollouts (the trained agent's and a random policy's, four episodes "
            "each, in episodes of the environment's registered length: 500 steps "
            "on seals/CartPole-v0, where training and the return use the config's "
            "`max_episode_steps`), labelled by true return, ties left out. "
            "Two-pass log rows: rows of the run's "
            "`progress.csv` whose `two_pass` is 1, out of those that have the key "
            "(imitation's trainer logs none). For reference, imitation's Pendulum "
            "tutorial (its PR #453) reports 95.1% reward accuracy at 10k timesteps.",
            "",
            table,
        ]
    if pong is None:
        parts += ["", "## Pong offline row: train_reward_model", "", "No Pong rows."]
    else:
        table, summary = pong_tables(pong)
        results["pong"] = pong
        results["pong_summary"] = summary
        parts += [
            "",
            "## Pong offline row: train_reward_model",
            "",
            f"Data: {json.dumps(pong['data'])}. A random agent on "
            f"`{PONG_ID}` (score masked); pairs of random fragments, ties left out, "
            "preference by true return; `CnnRewardNet` with "
            f"`{json.dumps(PONG_NET_KWARGS)}` (imitation's other defaults). "
            "Accuracy: `train_reward_model`'s held-out split, after each epoch "
            "(its pairs are never trained on; all fragments are cut from one "
            "trajectory, so held-out fragments may overlap training ones).",
            "",
            table,
        ]
    text = "\n".join(parts) + "\n"
    (out_dir / "learning_results.md").write_text(_results.with_made_by(text))
    (out_dir / "learning_results.json").write_text(
        json.dumps({"made_by": made_by, "results": results}, indent=1) + "\n"
    )
    plot(out_dir / "learning_results.png", mlp_rows, pong, made_by)


# ------------------------------------------------------------------------ main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets, 1 seed")
    parser.add_argument("--parts", default="mlp,pong", help="mlp, pong or both")
    parser.add_argument("--seeds", type=int, default=5, help="MLP seeds")
    parser.add_argument("--envs", nargs="+", default=list(MLP_ENVS), choices=MLP_ENVS)
    parser.add_argument("--held-out-pairs", type=int, default=500)
    for key in ("total_timesteps", "total_comparisons", "num_iterations"):
        parser.add_argument(
            f"--{key.replace('_', '-')}", type=int, help=f"MLP runs' {key}"
        )
    parser.add_argument(
        "--reuse",
        type=pathlib.Path,
        nargs="+",
        default=[],
        help="learning_results.json files of earlier runs, or their standard "
        "output (the rows they printed): their parts are taken from there "
        "instead of run again",
    )
    parser.add_argument("--pong-seeds", type=int, default=2)
    parser.add_argument("--pong-pairs", type=int, default=160)
    parser.add_argument("--pong-length", type=int, default=50)
    parser.add_argument("--pong-steps", type=int, default=4000)
    parser.add_argument("--pong-batch", type=int, default=24)
    parser.add_argument("--pong-epochs", type=int, default=3)
    parser.add_argument("--pong-lr", type=float, default=5e-3)
    parser.add_argument("--pong-held-out", type=float, default=0.25)
    parser.add_argument(
        "--jobs", type=int, default=2, help="runs at a time (fresh processes)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="OMP threads of each run"
    )
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    _results.add_out_dir(parser)
    args = parser.parse_args(argv)
    args.mlp_overrides = {}
    # One epoch per iteration: imitation's first training phase runs 200 times as
    # many (initial_epoch_multiplier), and the two-pass runs cost one step per chunk.
    args.mlp_epochs = 1
    if args.quick:
        args.seeds = min(args.seeds, 1)
        args.pong_seeds = min(args.pong_seeds, 1)
        args.held_out_pairs = 50
        args.pong_pairs, args.pong_length, args.pong_steps = 24, 12, 400
        args.pong_batch, args.pong_epochs = 16, 2
        args.mlp_overrides = dict(
            total_timesteps=600,
            total_comparisons=12,
            num_iterations=2,
            fragment_length=10,
            environment=dict(parallel=False, num_vec=2),
            rl=dict(batch_size=64, rl_kwargs=dict(batch_size=32, n_epochs=1)),
            policy_evaluation=dict(n_episodes_eval=1),
        )
        args.mlp_epochs = 1
    for key in ("total_timesteps", "total_comparisons", "num_iterations"):
        if getattr(args, key) is not None:
            args.mlp_overrides[key] = getattr(args, key)
    return args


def _earlier_results(path: pathlib.Path, args: argparse.Namespace) -> Dict[str, Any]:
    """An earlier run's results: its ``learning_results.json``, or its printed rows.

    A run's standard output holds one JSON line per finished run (and one for the
    Pong data), so a run cut short still gives the rows it finished; the Pong
    settings are then this command's ``--pong-*`` options.
    """
    if path.suffix == ".json":
        return dict(json.loads(path.read_text()))
    mlp: List[Dict[str, Any]] = []
    pong_rows: List[Dict[str, Any]] = []
    data: Optional[Dict[str, Any]] = None
    for line in path.read_text().splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        if value.get("part") == "mlp":
            mlp.append(value)
        elif value.get("part") == "pong":
            pong_rows.append(value)
        elif "pong_data" in value:
            data = dict(value["pong_data"], **_pong_settings(args))
    results: Dict[str, Any] = {"mlp": mlp}
    if pong_rows and data is not None:
        results["pong"] = dict(data=data, rows=pong_rows)
    n_rows = len(mlp) + len(pong_rows)
    return {
        "made_by": f"{n_rows} row(s) printed in {path.name} (a run's output)",
        "results": results,
    }


@contextlib.contextmanager
def _workdir() -> Iterator[pathlib.Path]:
    with tempfile.TemporaryDirectory(prefix="learning-results-") as path:
        yield pathlib.Path(path)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Runs the parts asked for and writes the report."""
    args = parse_args(argv)
    if args.worker:
        kind, spec = args.worker[0], json.loads(args.worker[1])
        row = mlp_worker(spec) if kind == "mlp" else pong_worker(spec)
        print(RESULT_PREFIX + json.dumps(row), flush=True)
        return
    out_dir = _results.resolve_out_dir(args)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"mlp", "pong"}
    if unknown or not parts:
        raise SystemExit(f"--parts={args.parts!r}: give mlp, pong or mlp,pong")
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    mlp_rows: List[Dict[str, Any]] = []
    pong: Optional[Dict[str, Any]] = None
    pong_data: Dict[str, Any] = {}
    reused: List[str] = []
    for path in args.reuse:
        earlier = _earlier_results(path, args)
        if earlier["results"].get("mlp"):
            mlp_rows += earlier["results"]["mlp"]  # e.g. one file per environment
            parts.discard("mlp")
            reused.append(f"MLP rows: {earlier['made_by']}")
        if earlier["results"].get("pong"):
            pong = earlier["results"]["pong"]
            parts.discard("pong")
            reused.append(f"Pong row: {earlier['made_by']}")
    if args.jobs < 1:
        raise SystemExit(f"--jobs={args.jobs}: give 1 or more")
    with _workdir() as workdir:
        specs: List[Tuple[str, Dict[str, Any]]] = []
        if "pong" in parts:
            # First: the longest runs, so that the last to end is a short one.
            pong_data, specs = pong_specs(args, workdir)
        if "mlp" in parts:
            specs += mlp_specs(args)
        rows = run_workers(specs, args.jobs, args.threads)
    if "mlp" in parts:
        mlp_rows = [r for r in rows if r["part"] == "mlp"]
    if "pong" in parts:
        pong = dict(data=pong_data, rows=[r for r in rows if r["part"] == "pong"])
    args.reused = reused
    args.ran = bool(parts)
    write_report(
        out_dir,
        args,
        mlp_rows,
        pong,
        (load0, os.getloadavg()[0]),
        time.perf_counter() - start,
    )
    print(f"wrote {out_dir / 'learning_results.md'}")


if __name__ == "__main__":
    main()
