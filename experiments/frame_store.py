r"""Host memory and speed of the frame store on real Pong frames.

Frames come from the package's Atari environment (``PongNoFrameskip-v4``,
score masked, 84x84 grayscale, 4 stacked, random actions); fragment pairs are cut
from that trajectory by imitation's ``RandomFragmenter`` (views, as in a run) with
random preferences. Each measurement of memory runs in a fresh process:

1. Bytes per pair: from the arrays (the store's ``nbytes``; for imitation's
   dataset its fragments' arrays), and from the process's anonymous resident
   memory (``RssAnon``) after every push of 100 pairs: its slope (least squares)
   and its value at the largest size. imitation's dataset is filled with copies
   of the fragments, as one loaded from its pickle holds them (as views, each
   fragment would keep its whole episode alive instead).
2. Offline training from a memory-mapped store: ``RssAnon`` before training (the
   store opened) and its peak (sampled every 10 ms) while
   ``CrossEntropyRewardTrainer`` trains ``CnnRewardNet`` on pairs drawn from the
   whole store (``memory_budget`` sizes its chunks); the growth as a share of
   the store's size.
3. Seconds per epoch on the CPU, the same pairs read from the store (memory-
   mapped, page cache warm) and from imitation's dataset in memory, alternating
   runs; the ratio of the medians, and whether the parameters came out equal.

Usage::

    python experiments/frame_store.py            # docs/results/frame_store.md
    python experiments/frame_store.py --quick --out-dir /tmp/fs   # seconds

``--quick`` uses 10-step fragments, a few pairs and one timed run: its figures
mean nothing.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import torch as th

import _results

MIB = 2**20


def pong_trajectory(steps: int, seed: int = 0):
    """One trajectory of ``steps`` random-action steps of masked Pong."""
    import ale_py  # noqa: F401  (registers the ALE ids)
    from imitation.data import types

    from imitation_accum.envs import atari

    env = atari.make_atari_env("PongNoFrameskip-v4", masked=True)
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
    return types.TrajectoryWithRew(
        obs=np.stack(observations),
        acts=np.array(actions),
        infos=None,
        terminal=False,
        rews=np.array(rewards, dtype=np.float32),
    )


def cut_pairs(trajectory, n_pairs: int, length: int, seed: int):
    """Pairs of ``length``-step fragments of ``trajectory`` (views), preferences."""
    from imitation.algorithms import preference_comparisons as pc

    rng = np.random.default_rng(seed)
    fragmenter = pc.RandomFragmenter(rng=rng, warning_threshold=0)
    pairs = fragmenter([trajectory], fragment_length=length, num_pairs=n_pairs)
    return pairs, rng.uniform(size=n_pairs).astype(np.float32)


def copied(pairs):
    """The pairs with their own arrays, as imitation's pickle gives them back."""
    import dataclasses

    return [
        tuple(
            dataclasses.replace(
                f, obs=f.obs.copy(), acts=f.acts.copy(), rews=f.rews.copy()
            )
            for f in pair
        )
        for pair in pairs
    ]


def rss_anon() -> int:
    """This process's anonymous resident memory, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakSampler:
    """The peak of :func:`rss_anon`, sampled every ``interval`` seconds."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.peak = rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(self.interval)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())


# -- workers (each in its own process) ---------------------------------------------


def worker_fill(kind: str, n_pairs: int, length: int, steps: int) -> Dict[str, Any]:
    """RssAnon while a dataset of ``kind`` fills with ``n_pairs`` pairs."""
    import gc

    from imitation.algorithms import preference_comparisons as pc

    from imitation_accum import PreferenceDataset

    trajectory = pong_trajectory(steps)
    dataset = PreferenceDataset() if kind == "store" else pc.PreferenceDataset()
    gc.collect()
    base = rss_anon()
    points, array_bytes = [], 0
    step = min(100, n_pairs)
    for start in range(0, n_pairs, step):
        pairs, prefs = cut_pairs(trajectory, step, length, seed=start)
        if kind == "imitation":
            pairs = copied(pairs)
            array_bytes += sum(
                f.obs.nbytes + f.acts.nbytes + f.rews.nbytes for p in pairs for f in p
            )
        dataset.push(pairs, prefs)
        del pairs
        gc.collect()
        points.append((len(dataset), rss_anon() - base))
    if kind == "store":
        array_bytes = sum(dataset.nbytes.values())
    return {"points": points, "array_bytes": array_bytes, "pairs": len(dataset)}


def make_trainer(seed: int, memory_budget=None, minibatch_size=None, cls=None):
    from gymnasium import spaces
    from imitation.algorithms import preference_comparisons as pc
    from imitation.rewards import reward_nets

    from imitation_accum import CrossEntropyRewardTrainer

    th.manual_seed(seed)
    net = reward_nets.CnnRewardNet(
        spaces.Box(0, 255, (84, 84, 4), np.uint8),
        spaces.Discrete(6),
    )
    trainer = (cls or CrossEntropyRewardTrainer)(
        pc.PreferenceModel(net),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(seed),
        batch_size=4,
        minibatch_size=minibatch_size,
        memory_budget=memory_budget,
        epochs=1,
        forward_size=20,
        progress_bar=False,
    )
    return net, trainer


def worker_train_mapped(store: str, n_train: int, budget: str) -> Dict[str, Any]:
    """RssAnon growth while training on ``n_train`` pairs of a memory-mapped store."""
    import gc

    from torch.utils import data as data_th

    from imitation_accum import PreferenceDataset

    dataset = PreferenceDataset.load(store)
    chosen = np.random.default_rng(0).choice(len(dataset), n_train, replace=False)
    _, trainer = make_trainer(0, memory_budget=budget)
    gc.collect()
    before = rss_anon()
    start = time.perf_counter()
    with PeakSampler() as sampler:
        trainer.train(data_th.Subset(dataset, sorted(chosen.tolist())))
    size = sum(p.stat().st_size for p in pathlib.Path(store).iterdir())
    return {
        "before": before,
        "peak": sampler.peak,
        "store_bytes": size,
        "seconds": time.perf_counter() - start,
        "pairs": len(dataset),
        "trained_pairs": n_train,
    }


def worker_train_mapped_ddp(
    store: str, n_train: int, budget: str, out: str
) -> Dict[str, Any]:
    """:func:`worker_train_mapped` on every rank of a ``torchrun`` job (gloo)."""
    import gc

    from torch.utils import data as data_th

    from imitation_accum import DistributedRewardTrainer, PreferenceDataset, distributed

    with distributed.distributed_session("cpu") as context:
        dataset = PreferenceDataset.load(store)
        chosen = np.random.default_rng(0).choice(len(dataset), n_train, replace=False)
        _, trainer = make_trainer(0, memory_budget=budget, cls=DistributedRewardTrainer)
        gc.collect()
        before = rss_anon()
        with PeakSampler() as sampler:
            trainer.train(data_th.Subset(dataset, sorted(chosen.tolist())))
        result = {"before": before, "peak": sampler.peak, "rank": context.rank}
        pathlib.Path(out, f"rank{context.rank}.json").write_text(json.dumps(result))
    return result


def worker_epoch_times(n_pairs: int, length: int, steps: int, repeats: int):
    """Seconds per epoch from the store (memory-mapped) and from memory."""
    from imitation.algorithms import preference_comparisons as pc

    from imitation_accum import PreferenceDataset

    trajectory = pong_trajectory(steps)
    pairs, prefs = cut_pairs(trajectory, n_pairs, length, seed=1)
    in_memory = pc.PreferenceDataset()
    in_memory.push(copied(pairs), prefs)
    with tempfile.TemporaryDirectory() as directory:
        store = PreferenceDataset()
        store.push(pairs, prefs)
        store.save(pathlib.Path(directory) / "store")
        mapped = PreferenceDataset.load(pathlib.Path(directory) / "store")
        del store, pairs, trajectory
        times: Dict[str, List[float]] = {"memory": [], "store": []}
        params = {}
        for run in range(repeats + 1):  # the first run of each warms up
            for kind, dataset in (("memory", in_memory), ("store", mapped)):
                net, trainer = make_trainer(run, minibatch_size=2)
                start = time.perf_counter()
                trainer.train(dataset)
                if run:
                    times[kind].append(time.perf_counter() - start)
                params[kind] = [p.detach().clone() for p in net.parameters()]
            identical = all(
                th.equal(a, b) for a, b in zip(params["memory"], params["store"])
            )
            if not identical:
                break
    return {"times": times, "identical": identical, "pairs": n_pairs}


WORKERS = {
    "fill": worker_fill,
    "train_mapped": worker_train_mapped,
    "train_mapped_ddp": worker_train_mapped_ddp,
    "epoch_times": worker_epoch_times,
}


def in_torchrun(n_procs: int, name: str, *args: Any) -> List[Dict[str, Any]]:
    """Runs worker ``name`` on ``n_procs`` ranks of a ``torchrun`` job; results."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={n_procs}",
                __file__,
                "--worker",
                name,
                json.dumps([*args, out]),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"torchrun {name}{args} failed:\n{done.stderr[-4000:]}")
        return [
            json.loads(pathlib.Path(out, f"rank{r}.json").read_text())
            for r in range(n_procs)
        ]


def in_subprocess(name: str, *args: Any) -> Dict[str, Any]:
    """Runs worker ``name`` in a fresh process; its JSON result."""
    done = subprocess.run(
        [sys.executable, __file__, "--worker", name, json.dumps(args)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"worker {name}{args} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the table -----------------------------------------------------------------


def slope(points: Sequence[Tuple[int, int]]) -> float:
    """Bytes per pair: the least-squares slope of RssAnon over pairs."""
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    if len(x) < 2:
        return float(y[-1] / x[-1])
    return float(np.polyfit(x, y, 1)[0])


def write_table(results: Dict[str, Any], settings: Dict[str, Any], out_dir) -> None:
    store, imitation = results["store"], results["imitation"]
    mapped, epochs = results["mapped"], results["epochs"]
    length = settings["length"]
    lines = [
        f"Frame store on real Pong frames: {length}-step fragments of 84x84x4 "
        "uint8 observations (masked Pong, random actions).",
        "",
        "| dataset | pairs | bytes/pair (arrays) | bytes/pair (RssAnon slope) | "
        "RssAnon at that size |",
        "|---|---|---|---|---|",
    ]
    for name, fill in (("frame store", store), ("imitation (copies)", imitation)):
        lines.append(
            f"| {name} | {fill['pairs']} | "
            f"{fill['array_bytes'] / fill['pairs'] / 1e6:.3f} MB | "
            f"{slope(fill['points']) / 1e6:.3f} MB | "
            f"{fill['points'][-1][1] / 2**30:.2f} GiB |",
        )
    growth = mapped["peak"] - mapped["before"]
    before_ddp = sum(rank["before"] for rank in results["mapped_ddp"])
    peak_ddp = sum(rank["peak"] for rank in results["mapped_ddp"])
    median = {k: statistics.median(v) for k, v in epochs["times"].items()}
    lines += [
        "",
        f"imitation's dataset, at its slope, would hold {store['pairs']} pairs in "
        f"{slope(imitation['points']) * store['pairs'] / 2**30:.1f} GiB.",
        "",
        "| offline training from a memory-mapped store | value |",
        "|---|---|",
        f"| store | {mapped['pairs']} pairs, {mapped['store_bytes'] / 2**30:.2f} GiB "
        "on disk |",
        f"| trained on | {mapped['trained_pairs']} pairs drawn from the whole store, "
        f"memory_budget={settings['budget']}, {mapped['seconds']:.0f} s |",
        f"| RssAnon before training | {mapped['before'] / MIB:.0f} MiB |",
        f"| RssAnon peak while training | {mapped['peak'] / MIB:.0f} MiB |",
        f"| growth / store size | {growth / mapped['store_bytes']:.1%} |",
        f"| 2 torchrun processes (gloo): RssAnon before, both | {before_ddp / MIB:.0f}"
        " MiB |",
        f"| 2 torchrun processes: RssAnon peaks, both | {peak_ddp / MIB:.0f} MiB |",
        f"| 2 torchrun processes: growth / store size | "
        f"{(peak_ddp - before_ddp) / mapped['store_bytes']:.1%} |",
        "",
        f"| epoch over {epochs['pairs']} pairs (CnnRewardNet, CPU) | seconds "
        "(median) | runs |",
        "|---|---|---|",
        f"| imitation's dataset in memory | {median['memory']:.2f} | "
        f"{len(epochs['times']['memory'])} |",
        f"| frame store, memory-mapped | {median['store']:.2f} | "
        f"{len(epochs['times']['store'])} |",
        f"| ratio store / memory | {median['store'] / median['memory']:.3f} | |",
        f"| parameters bit-identical | {'yes' if epochs['identical'] else 'NO'} | |",
    ]
    path = out_dir / "frame_store.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_results.with_made_by("\n".join(lines)))
    print("\n".join(lines))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="seconds, to check it runs"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("worker_args", nargs="?", help=argparse.SUPPRESS)
    _results.add_out_dir(parser)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](*json.loads(args.worker_args))))
        return
    _results.resolve_out_dir(args)
    if args.quick:
        settings = dict(
            length=10,
            steps=200,
            store_pairs=20,
            imitation_pairs=20,
            mapped_pairs=20,
            train_pairs=2,
            epoch_pairs=2,
            repeats=1,
            budget="256MiB",
        )
    else:
        settings = dict(
            length=100,
            steps=3000,
            store_pairs=5000,
            imitation_pairs=500,
            mapped_pairs=3000,
            train_pairs=8,
            epoch_pairs=8,
            repeats=5,
            budget="256MiB",
        )
    s = settings
    results: Dict[str, Any] = {}
    results["store"] = in_subprocess(
        "fill", "store", s["store_pairs"], s["length"], s["steps"]
    )
    print("store", results["store"]["points"][-1], flush=True)
    results["imitation"] = in_subprocess(
        "fill", "imitation", s["imitation_pairs"], s["length"], s["steps"]
    )
    print("imitation", results["imitation"]["points"][-1], flush=True)
    scratch = _results.REPO_ROOT / "output"  # on disk, not a RAM file system
    scratch.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch) as directory:
        store = pathlib.Path(directory) / "store"
        build_store(store, s["mapped_pairs"], s["length"], s["steps"])
        results["mapped"] = in_subprocess(
            "train_mapped", str(store), s["train_pairs"], s["budget"]
        )
        results["mapped_ddp"] = in_torchrun(
            2, "train_mapped_ddp", str(store), s["train_pairs"], s["budget"]
        )
    print("mapped", results["mapped"], flush=True)
    results["epochs"] = in_subprocess(
        "epoch_times", s["epoch_pairs"], s["length"], s["steps"], s["repeats"]
    )
    print("epochs", results["epochs"], flush=True)
    write_table(results, settings, args.out_dir)


def build_store(path: pathlib.Path, n_pairs: int, length: int, steps: int) -> None:
    """Saves a store of ``n_pairs`` Pong pairs at ``path``, pushed 100 at a time."""
    from imitation_accum import PreferenceDataset

    trajectory = pong_trajectory(steps, seed=2)
    dataset = PreferenceDataset()
    for start in range(0, n_pairs, 100):
        pairs, prefs = cut_pairs(trajectory, min(100, n_pairs - start), length, start)
        dataset.push(pairs, prefs)
    dataset.save(path)


if __name__ == "__main__":
    main()
