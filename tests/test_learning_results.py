"""Tests of ``experiments/learning_results.py``: its figures and its ``--quick`` run.

The helpers that turn runs into figures (held-out accuracy over non-tied pairs,
the two-pass count read from a run's log, the summary tables) are checked on
made-up inputs whose answers are known; the whole script runs once in its
``--quick`` mode (minutes on two shared cores, so ``expensive``).
"""

import json
import os
import pathlib
import subprocess
import sys
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest
from imitation.data.types import TrajectoryWithRew

REPO = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"


@pytest.fixture(scope="module")
def learning_results() -> Iterator[Any]:
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        import learning_results

        yield learning_results
    finally:
        sys.path.remove(str(EXPERIMENTS))


class _SumNet:
    """A stand-in reward net: the reward is the observation's first feature."""

    def predict(self, obs, acts, next_obs, dones) -> np.ndarray:
        del acts, next_obs, dones
        return np.asarray(obs)[:, 0]


def _fragment(obs_values: List[float], rews: List[float]) -> TrajectoryWithRew:
    obs = np.array([[v] for v in [*obs_values, 0.0]], dtype=np.float32)
    return TrajectoryWithRew(
        obs=obs,
        acts=np.zeros(len(rews), dtype=np.int64),
        infos=None,
        terminal=False,
        rews=np.array(rews, dtype=np.float32),
    )


def test_pair_accuracy_counts_non_tied_pairs_only(learning_results):
    right = (_fragment([1, 1], [0, 0]), _fragment([2, 2], [1, 0]))  # both agree
    wrong = (_fragment([3, 3], [0, 0]), _fragment([0, 0], [0, 1]))  # net reversed
    tied = (_fragment([5, 5], [1, 0]), _fragment([0, 0], [0, 1]))  # left out
    accuracy, counted = learning_results.pair_accuracy(
        _SumNet(), [right, wrong, tied, right]
    )
    assert counted == 3
    assert accuracy == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="tied"):
        learning_results.pair_accuracy(_SumNet(), [tied])


def test_two_pass_steps_read_from_the_log(learning_results, tmp_path):
    log = tmp_path / "run" / "log"
    log.mkdir(parents=True)
    (log / "progress.csv").write_text(
        "reward/epoch-0/train/two_pass,reward/epoch-0/train/loss,other\n"
        "1.0,0.5,3\n"
        "0.0,0.4,3\n"
        ",0.3,3\n"
    )
    assert learning_results._two_pass_steps(tmp_path) == (1, 2)
    assert learning_results._two_pass_steps(tmp_path / "nothing") == (0, 0)


def _mlp_row(setting: str, seed: int, gt_return: float) -> Dict[str, Any]:
    return dict(
        part="mlp",
        env="seals_cartpole",
        setting=setting,
        seed=seed,
        gt_return=gt_return,
        held_out_accuracy=0.5 + seed / 10,
        held_out_pairs=10,
        train_accuracy=1.0,
        two_pass_steps=0,
        logged_steps=0,
        seconds=1.0,
    )


def test_mlp_summary_compares_medians_with_upstreams_range(learning_results):
    upstream = learning_results.UPSTREAM
    rows = [_mlp_row(upstream, s, r) for s, r in enumerate([10.0, 20.0, 30.0])]
    rows += [_mlp_row("inside", s, r) for s, r in enumerate([12.0, 25.0, 90.0])]
    rows += [_mlp_row("outside", s, r) for s, r in enumerate([40.0, 50.0, 60.0])]
    text, summary = learning_results.mlp_tables(rows)
    by_setting = {s["setting"]: s for s in summary}
    assert by_setting["inside"]["return_median"] == 25.0
    assert by_setting["inside"]["within_upstream_range"]
    assert not by_setting["outside"]["within_upstream_range"]
    assert by_setting["outside"]["return_median_minus_upstream"] == 30.0
    assert by_setting[upstream]["accuracy_median"] == pytest.approx(0.6)
    assert "Largest difference of a median return from upstream's: 30.0" in text
    assert "(seals_cartpole, outside)" in text
    # Seed 2: the package's settings gave 90.0 and 60.0 (upstream's row left out).
    assert "at the same seed (the same update up to round-off, which training " in text
    assert "amplifies): return 30.0, held-out accuracy 0.000." in text


def test_pong_summary_gaps_and_seed_spread(learning_results):
    def row(setting: str, seed: int, accuracy: List[float]) -> Dict[str, Any]:
        return dict(
            setting=setting,
            seed=seed,
            accuracy=accuracy,
            loss=[0.0] * len(accuracy),
            two_pass_steps=0,
            logged_steps=0,
            seconds=1.0,
        )

    rows = [
        row("a", 0, [0.5, 0.7]),
        row("a", 1, [0.7, 0.9]),
        row("b", 0, [0.6, 0.7]),
        row("b", 1, [0.8, 0.9]),
    ]
    text, summary = learning_results.pong_tables({"data": {}, "rows": rows})
    assert summary[0]["epoch_gaps"] == pytest.approx([0.1, 0.0])
    assert summary[0]["epoch_seed_spreads"] == pytest.approx([0.2, 0.2])
    assert {s["setting"]: s["final_median"] for s in summary} == {
        "a": pytest.approx(0.8),
        "b": pytest.approx(0.8),
    }
    assert "| a | 0 | 0.500 | 0.700 |" in text
    assert "at least 0.85: 0 of 2." in text
    assert "Largest gap between settings' mean accuracy: 0.100 (epoch 1)" in text
    assert "below the seed-to-seed spread at every epoch: yes." in text
    assert "at the same seed and epoch (the same update" in text
    assert text.rstrip().endswith("AdamW amplifies): 0.100.")
    # Epoch 1: a gap of 0.1 between settings, none between seeds' means.
    rows[0] = row("a", 0, [0.9, 0.9])
    rows[2] = row("b", 0, [0.6, 0.8])
    rows[3] = row("b", 1, [0.8, 1.0])
    text, _ = learning_results.pong_tables({"data": {}, "rows": rows})
    assert "at least 0.85: 2 of 2 (a, b)." in text
    assert "below the seed-to-seed spread at every epoch: no." in text


def test_mlp_config_merges_nested_updates(learning_results):
    base = {"rl": {"batch_size": 8, "rl_kwargs": {"n_epochs": 10, "gamma": 0.9}}}
    merged = learning_results._merged(base, {"rl": {"rl_kwargs": {"n_epochs": 1}}})
    expected = {"rl": {"batch_size": 8, "rl_kwargs": {"n_epochs": 1, "gamma": 0.9}}}
    assert merged == expected
    assert base["rl"]["rl_kwargs"]["n_epochs"] == 10  # a copy: the base is kept
    # --quick's environment override keeps the common one-process setting.
    quick = learning_results.parse_args(["--quick"]).mlp_overrides
    config = learning_results.mlp_config("pendulum", quick)
    assert config["environment"] == {"parallel": False, "num_vec": 2}
    assert config["total_timesteps"] == quick["total_timesteps"]


@pytest.mark.expensive  # a dozen fresh processes: minutes on two shared cores
def test_quick_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p
    )
    done = subprocess.run(
        [
            sys.executable,
            str(EXPERIMENTS / "learning_results.py"),
            "--quick",
            "--threads",
            "1",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "learning_results.md").read_text()
    assert (
        text.rstrip()
        .splitlines()[-1]
        .startswith("Made by: `python experiments/learning_results.py --quick")
    )
    results = json.loads((tmp_path / "learning_results.json").read_text())
    assert results["made_by"].startswith("Made by: ")
    mlp = results["results"]["mlp"]
    assert {r["env"] for r in mlp} == {"seals_cartpole", "pendulum"}
    assert len(mlp) == 8  # two environments, four settings, one seed
    for row in mlp:
        assert 0 <= row["held_out_accuracy"] <= 1 and row["held_out_pairs"] > 0
        two_passes = row["setting"] == "package, two passes"
        # imitation's trainer logs no plan; the budget must split every step.
        if two_passes:
            assert row["logged_steps"] > 0
            assert row["two_pass_steps"] == row["logged_steps"]
        else:
            assert row["two_pass_steps"] == 0
    pong = results["results"]["pong"]["rows"]
    assert len(pong) == 4
    for row in pong:
        assert len(row["accuracy"]) == 2  # one figure per epoch
        assert all(0 <= a <= 1 for a in row["accuracy"])
        if row["setting"] == "two passes":
            assert row["two_pass_steps"] == row["logged_steps"] > 0
        else:
            assert row["two_pass_steps"] == 0
    png = (tmp_path / "learning_results.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_rows_reused_from_a_run_cut_short(learning_results, tmp_path):
    row = _mlp_row(learning_results.UPSTREAM, 0, 12.5)
    pong = dict(part="pong", setting="minibatch 4", seed=0, accuracy=[0.5])
    log = tmp_path / "run.log"
    log.write_text(
        "a warning\n"
        + json.dumps(row)
        + "\n"
        + json.dumps({"pong_data": {"steps": 10}})
        + "\n"
        + json.dumps(pong)
        + "\n[1, 2]\n"
    )
    args = learning_results.parse_args(["--pong-epochs", "7"])
    earlier = learning_results._earlier_results(log, args)
    assert earlier["results"]["mlp"] == [row]
    assert earlier["results"]["pong"]["rows"] == [pong]
    assert earlier["results"]["pong"]["data"]["steps"] == 10
    assert earlier["results"]["pong"]["data"]["epochs"] == 7
    assert "run.log" in earlier["made_by"]


def test_rows_read_back_are_ordered_by_environment_seed_and_setting(learning_results):
    upstream = learning_results.UPSTREAM
    names = [upstream, "package, whole batch", "package, minibatch 5"]
    names.append("package, two passes")
    rows = [
        dict(_mlp_row(name, seed, 0.0), env=env)
        for env in ("seals_cartpole", "pendulum")
        for seed in (0, 1)
        for name in names
    ]
    shuffled = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
    assert sorted(shuffled, key=learning_results._mlp_order) == rows
    pong = [
        dict(setting=name, seed=seed)
        for seed in (0, 1)
        for name in ("minibatch 4", "minibatch 16", "whole batch (24)", "two passes")
    ]
    assert sorted(pong[::-1], key=learning_results._pong_order) == pong
