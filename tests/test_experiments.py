"""Smoke tests of ``experiments/``: every script's ``--quick`` mode, on the CPU.

Each script runs as its own process from the repository root, writing into
pytest's ``tmp_path`` (``--out-dir``; without it a quick run writes to
``output/experiments/``, which one test checks in a copy of the scripts, and a
full run to ``docs/results/``); the test checks the files it wrote: their
tables' headers and rows, and the line naming the command and the machine. The
figures of a quick run mean nothing as measurements; what is checked is that
they parse, that a row's ratios are computed from the figures in the same row,
and what an experiment exists to show (parity: accumulation's results do not
depend on the minibatch size). One thread per process (``OMP_NUM_THREADS=1``):
on a small shared machine more only spin.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Sequence

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"
COMMITTED = REPO / "docs" / "results"
SCRIPTS = sorted(p.name for p in EXPERIMENTS.iterdir() if p.suffix in (".py", ".sh"))
#: Modules the scripts import (``_results``, ``_quiet_logger``): not scripts.
HELPERS = sorted(name for name in SCRIPTS if name.startswith("_"))
TIMEOUT_S = 600


def environment() -> Dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHON": sys.executable,  # gpu_check.sh's interpreter
    }


def run(command: Sequence[str]) -> str:
    """Runs ``command`` in the repository root; it must succeed. Its output."""
    done = subprocess.run(
        list(command),
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def run_script(name: str, out_dir: pathlib.Path, *args: str) -> str:
    return run(
        [sys.executable, f"experiments/{name}", *args, "--out-dir", str(out_dir)]
    )


def read(path: pathlib.Path) -> str:
    assert path.is_file(), f"{path.name} not written"
    text = path.read_text()
    assert text.strip(), f"{path.name} is empty"
    return text


def table(text: str, header: Sequence[str], min_rows: int) -> List[List[str]]:
    """The first Markdown table of ``text``: its header starts with ``header``.

    Every row has the header's number of cells. Returns the rows' cells.
    """
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert lines, f"no table in:\n{text}"

    def cells(line: str) -> List[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    head = cells(lines[0])
    assert head[: len(header)] == list(header), head
    assert set(lines[1].replace("|", "").replace(":", "")) == {"-"}, lines[1]
    rows = [cells(line) for line in lines[2:]]
    assert len(rows) >= min_rows, text
    for row in rows:
        assert len(row) == len(head), row
    return rows


def number(cell: str) -> float:
    """A table's figure (``1.25x`` reads 1.25); it must parse and be finite."""
    value = float(cell[:-1] if cell.endswith("x") else cell)
    assert value == value and abs(value) != float("inf"), cell
    return value


def assert_ratio(cell: str, numerator: str, denominator: str) -> None:
    """``cell`` (``1.25x`` or ``1.25``) is numerator / denominator, as printed.

    The figures are printed to 4 significant digits and the ratio to 2
    decimals, so they agree to those roundings.
    """
    expected = number(numerator) / number(denominator)
    assert abs(number(cell) - expected) <= 0.005 + 2e-3 * expected, (
        cell,
        numerator,
        denominator,
    )


def assert_made_by(text: str, script: str, device: str = "cpu") -> None:
    """The line naming the command (with ``--quick``) and the machine."""
    lines = [line for line in text.splitlines() if line.startswith("Made by: ")]
    assert len(lines) == 1, text
    line = lines[0]
    assert re.match(rf"Made by: `(python )?experiments/{re.escape(script)} ", line)
    assert "--quick" in line and " --out" in line, line  # --out-dir or --out
    assert re.search(r" on .+ \(.*\d+ CPUs, \d+ torch threads?\), torch ", line)
    assert line.endswith(f"device {device}"), line


def made_by_json(path: pathlib.Path, script: str) -> list:
    """The ``results`` of a JSON file; its ``made_by`` names what made it."""
    data = json.loads(read(path))
    assert set(data) == {"made_by", "results"}, set(data)
    assert_made_by(data["made_by"], script)
    assert isinstance(data["results"], list) and data["results"]
    return data["results"]


def assert_png(path: pathlib.Path, script: str) -> None:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), path
    # matplotlib writes the Description as a tEXt chunk: latin-1 in the clear.
    assert f"Made by: `python experiments/{script}".encode() in data


def digests() -> Dict[str, str]:
    if not COMMITTED.is_dir():  # no table committed at this version
        return {}
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(COMMITTED.iterdir())
        if p.is_file()
    }


@pytest.fixture(autouse=True)
def _committed_results_untouched():
    """A quick run into ``tmp_path`` leaves ``docs/results/`` as it was."""
    before = digests()
    yield
    assert digests() == before


# The scripts ------------------------------------------------------------------


def test_every_script_is_tested_and_uses_docs_results():
    tested = {
        "atari_reward_memory.py",
        "bench_checkpoint_cost.py",
        "bench_discriminator.py",
        "bench_distributed.py",
        "bench_forward_size.py",
        "bench_memory.py",
        "bench_reward_trainer.py",
        "bench_rollout_reward.py",  # tests/test_rollout_reward.py
        "frame_store.py",  # tests/test_frame_store_experiment.py
        "frame_store_verify.py",  # tests/test_frame_store_experiment.py
        "gpu_bench.py",  # tests/test_gpu_bench.py
        "gpu_check.sh",
        "imitation_tests.py",
        "learning_results.py",  # tests/test_learning_results.py
        "parity.py",
        "run_all.py",  # tests/test_run_all.py
        "thread_threshold.py",
        "two_pass_drift.py",  # tests/test_two_pass_drift.py
    }
    assert HELPERS == ["_quiet_logger.py", "_results.py"]
    assert set(SCRIPTS) - set(HELPERS) == tested
    for name in SCRIPTS:
        text = (EXPERIMENTS / name).read_text()
        assert "experiments/results" not in text, name
        assert 'Path(__file__).parent / "results"' not in text, name
        if name not in HELPERS or name == "_results.py":  # it adds the options
            assert "--quick" in text and "--out-dir" in text, name
        if name.endswith(".py") and name not in HELPERS:
            assert "_results.resolve_out_dir(args)" in text, name
    assert "out=output/experiments" in (EXPERIMENTS / "gpu_check.sh").read_text()


def test_quick_run_defaults_to_output_experiments(tmp_path):
    """Without ``--out-dir``, ``--quick`` writes to ``output/experiments/``.

    The scripts find the repository root from their own path, so a copy of
    ``parity.py`` and ``_results.py`` under ``tmp_path/experiments`` takes
    ``tmp_path`` for the root and leaves the repository alone.
    """
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        import _results
    finally:
        sys.path.remove(str(EXPERIMENTS))
    assert _results.default_out_dir(quick=True) == REPO / "output" / "experiments"
    assert _results.default_out_dir(quick=False) == COMMITTED
    given = argparse.Namespace(out_dir=tmp_path, quick=True)
    assert _results.resolve_out_dir(given) == tmp_path  # --out-dir wins
    assert "output/" in (REPO / ".gitignore").read_text().split()  # git ignores it
    copy = tmp_path / "experiments"
    copy.mkdir()
    for name in (*HELPERS, "parity.py"):
        shutil.copy(EXPERIMENTS / name, copy / name)
    run([sys.executable, str(copy / "parity.py"), "--quick"])
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.md"))
    assert written == [pathlib.Path("output/experiments/parity.md")], written
    text = read(tmp_path / "output" / "experiments" / "parity.md")
    assert re.search(
        r"^Made by: `python experiments/parity\.py --quick` on ", text, re.M
    )


def test_bench_reward_trainer(tmp_path):
    run_script("bench_reward_trainer.py", tmp_path, "--quick")
    text = read(tmp_path / "bench_reward_trainer.md")
    header = [
        "config",
        "batch / minibatch",
        "imitation 1.0.1 s/epoch",
        "accum s/epoch",
        "floor s/epoch",
        "exact floor s/epoch",
        "imitation / accum",
        "accum / floor",
        "accum / exact floor",
        "accum forward_size",
        "floor forward_size",
    ]
    rows = table(text, header, min_rows=1)
    assert [row[0] for row in rows] == ["mlp"]
    row = rows[0]
    assert re.fullmatch(r"\d+ / \d+", row[1]), row
    assert all(number(cell) > 0 for cell in row[2:9]), row
    assert re.match(r"\d+", row[9]) and re.fullmatch(r"\d+(/\d+)*", row[10]), row
    assert re.fullmatch(r"\d+ \(\d+ threads?\)", row[9]), row  # the trainer's
    assert re.fullmatch(r"\d+(/\d+)* threads?", row[11]), row  # the floors'
    assert_made_by(text, "bench_reward_trainer.py")
    rows_json = made_by_json(
        tmp_path / "bench_reward_trainer.json", "bench_reward_trainer.py"
    )
    assert [(r["config"], r["mode"]) for r in rows_json] == [("mlp", "quiet")]
    assert_png(tmp_path / "bench_reward_trainer.png", "bench_reward_trainer.py")


@pytest.mark.expensive
def test_bench_reward_trainer_busy(tmp_path):
    run_script("bench_reward_trainer.py", tmp_path, "--busy", "--quick")
    text = read(tmp_path / "bench_reward_trainer.md")
    rows = table(text, ["config", "batch / minibatch"], min_rows=2)
    assert [(row[0], row[12]) for row in rows] == [("mlp", "quiet"), ("mlp", "busy")]
    for row in rows:
        assert all(number(cell) > 0 for cell in row[2:9]), row
    assert rows[1][11] == "1 thread"  # busy floors run one thread
    assert_made_by(text, "bench_reward_trainer.py")


def test_thread_threshold(tmp_path):
    run_script("thread_threshold.py", tmp_path, "--quick")
    text = read(tmp_path / "thread_threshold.md")
    header = ["net", "transitions per call", "MiB per call"]
    rows = table(text, header, min_rows=4)
    assert [row[0] for row in rows] == ["mlp", "mlp", "cnn84", "cnn84"]
    for row in rows:
        assert_ratio(row[6], row[4], row[5])  # wall: one thread / all
        assert_ratio(row[9], row[7], row[8])  # CPU time: one thread / all
        assert int(row[10]) >= 1
    per_call = [number(row[2]) for row in rows]
    assert per_call[0] < per_call[1] and per_call[2] < per_call[3]
    assert re.search(r"CALL_BYTES_PER_THREAD is [\d.]+ MiB", text)
    assert_made_by(text, "thread_threshold.py")


def test_bench_forward_size(tmp_path):
    run_script("bench_forward_size.py", tmp_path, "--quick")
    text = read(tmp_path / "bench_forward_size.md")
    header = ["config", "load", "default forward_size", "default s/epoch"]
    rows = table(text, header, min_rows=1)
    assert [row[:2] for row in rows] == [["mlp", "quiet"]]
    row = rows[0]
    assert int(row[2]) == 1600  # the whole chunk: each side in one call
    fixed = dict(part.split(": ") for part in row[4].split(", "))
    assert list(fixed) == ["64", "256", "800"]
    assert row[5] in fixed
    assert number(fixed[row[5]]) == min(number(v) for v in fixed.values())
    assert_ratio(row[6], row[3], fixed[row[5]])
    assert_made_by(text, "bench_forward_size.py")


def resumed_point(impl, seconds, mode="quiet"):
    """One point as a run prints it (``mode`` first)."""
    point = {
        "mode": mode,
        "impl": impl,
        "config": "mlp",
        "batch_size": 64,
        "minibatch_size": 16,
        "seconds_per_epoch": seconds,
        "peak_rss_mib": 400.0,
        "load_average": 0.5,
        "forward_size": 1600,
    }
    if impl == "accum":
        point.update(first_train_seconds=0.2, two_pass=False)
    return json.dumps(point)


def test_bench_reward_trainer_resumes_whole_repeats(tmp_path):
    # One whole repeat of the quick run's four points, then part of another
    # (a run cut short): the whole repeat is kept, nothing is measured again.
    log = tmp_path / "run.log"
    points = [
        resumed_point("imitation", 0.5),
        resumed_point("accum", 0.05),
        resumed_point("floor", 0.04),
        resumed_point("exact-floor", 0.045),
    ]
    log.write_text("\n".join(["not a point", *points, points[0]]) + "\n")
    resume = ("--quick", "--resume", str(log))
    output = run_script("bench_reward_trainer.py", tmp_path, *resume)
    assert '"impl"' not in output  # no point measured
    text = read(tmp_path / "bench_reward_trainer.md")
    rows = table(text, ["config", "batch / minibatch"], min_rows=1)
    assert [row[0] for row in rows] == ["mlp"]
    assert rows[0][1:11] == [
        "64 / 16",
        "0.5",
        "0.05",
        "0.04",
        "0.045",
        "10.00x",  # imitation / accum
        "1.25x",  # accum / floor
        "1.11x",  # accum / exact floor
        "1600",
        "1600",
    ]
    assert rows[0][-1] == "400 / 400 / 400 / 400", rows[0]
    assert "mlp quiet: 1" in text
    missing = subprocess.run(
        [sys.executable, "experiments/bench_reward_trainer.py", "--resume", "nope.log"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (
        missing.returncode == 2 and "--resume: nope.log is not a file" in missing.stderr
    )


def test_bench_reward_trainer_memory(tmp_path):
    run_script("bench_reward_trainer.py", tmp_path, "--quick", "--memory")
    text = read(tmp_path / "bench_reward_trainer_memory.md")
    header = [
        "cnn84: batch / minibatch (one pass)",
        "training memory MiB (peak RSS - RSS before training)",
        "s/epoch",
        "forward_size",
    ]
    rows = table(text, header, min_rows=2)
    assert [row[0] for row in rows] == ["4 / 1", "4 / 2"]
    assert_made_by(text, "bench_reward_trainer.py")


def test_bench_reward_trainer_same_process(tmp_path):
    run_script("bench_reward_trainer.py", tmp_path, "--quick", "--same-process")
    text = read(tmp_path / "bench_reward_trainer_same_process.md")
    header = [
        "config",
        "forward_size",
        "accum s/epoch",
        "floor s/epoch",
        "exact floor s/epoch",
        "by hand, with figures s/epoch",
    ]
    rows = table(text, header, min_rows=1)
    assert rows[0][:2] == ["mlp", "1600"]
    assert all(float(cell) > 0 for cell in rows[0][2:6]), rows[0]
    for row in rows:
        accum, floor, exact, hand = row[2:6]
        assert_ratio(row[6], accum, floor)
        assert_ratio(row[7], accum, exact)
        if hand != "—":
            assert_ratio(row[8], hand, floor)
            assert_ratio(row[9], accum, hand)
    assert_made_by(text, "bench_reward_trainer.py")


def test_bench_discriminator(tmp_path):
    run_script("bench_discriminator.py", tmp_path, "--quick", "--check")
    text = read(tmp_path / "bench_discriminator.md")
    header = [
        "device",
        "batch / minibatch",
        "s/step: bare (device) / bare (host) / train_disc(samples) / train_disc()",
    ]
    rows = table(text, header, min_rows=1)
    assert rows[0][:2] == ["cpu", "8 / 2"]
    exactness = re.search(r"Exactness \(--check\), cpu, batch 8, .*", text)
    assert exactness, text
    differences = re.findall(r"minibatch (\d+): (\d\.\de[-+]\d+)", exactness.group())
    assert [m for m, _ in differences] == ["1", "3", "5"]
    assert all(float(d) < 1e-5 for _, d in differences), differences
    assert_made_by(text, "bench_discriminator.py")


def test_bench_checkpoint_cost(tmp_path):
    run_script("bench_checkpoint_cost.py", tmp_path, "--quick")
    text = read(tmp_path / "bench_checkpoint_cost.md")
    header = ["iteration", "pairs held", "new pairs", "preferences appended"]
    rows = table(text, header, 2)
    assert rows[-1][0] == "median"
    for row in rows[:-1]:
        assert number(row[1]) > 0 and number(row[2]) > 0
        assert all(number(cell) >= 0 for cell in row[3:])
    assert "environments.pkl: " in text and "first append" in text
    assert_made_by(text, "bench_checkpoint_cost.py")


def test_bench_memory(tmp_path):
    output = run_script("bench_memory.py", tmp_path, "--quick", "--check")
    assert "CHECKS PASSED" in output
    text = read(tmp_path / "memory.md")
    header = [
        "point",
        "chunk (transitions)",
        "call size",
        "two-pass",
        "step peak (GiB, RSS added)",
        "step estimate (GiB)",
    ]
    rows = table(text, header, min_rows=5)
    assert [row[0] for row in rows] == [
        "minibatch_size=1",
        "minibatch_size=2",
        "memory_budget=1GiB",
        "two pass, same chunk, one call per chunk",
        "default (forward_size='auto')",
    ]
    assert "Budget points whose train peak is within the budget: 1 of 1." in text
    assert_made_by(text, "bench_memory.py")
    points = made_by_json(tmp_path / "memory.json", "bench_memory.py")
    assert {"label", "peak_bytes", "estimate_bytes", "step_seconds"} <= set(points[0])
    assert [p["forward_size"] for p in points[:2]] == [4, 8]
    assert all(p["estimate_bytes"] > 0 for p in points)
    assert_png(tmp_path / "memory.png", "bench_memory.py")


def test_bench_distributed(tmp_path):
    run_script("bench_distributed.py", tmp_path, "--quick", "--device", "cpu")
    text = read(tmp_path / "bench_distributed.md")
    header = ["processes", "threads each", "device", "pairs/s", "vs 1st row"]
    rows = table(text, header, min_rows=2)
    assert [row[0] for row in rows] == ["1", "2"]
    assert rows[1][2] == "cpu (gloo)"
    assert_made_by(text, "bench_distributed.py")
    results = made_by_json(tmp_path / "bench_distributed.json", "bench_distributed.py")
    assert [r["processes"] for r in results] == [1, 2]
    assert {"pairs_per_second", "forward_size", "backend"} <= set(results[0])
    for row, result in zip(rows, results):
        assert int(row[1]) == result["threads_per_process"] >= 1, row
        assert number(row[3]) > 0, row
        assert number(row[3]) == pytest.approx(result["pairs_per_second"], abs=0.05)
        ratio = result["pairs_per_second"] / results[0]["pairs_per_second"]
        assert row[4] == f"{ratio:.2f}", row
    assert rows[0][4] == "1.00"


def test_parity(tmp_path):
    run_script("parity.py", tmp_path, "--quick")
    text = read(tmp_path / "parity.md")
    assert text.startswith("Held-out accuracy on 400 pairs after 2 epochs")
    header = ["seed", "accum mb=32", "accum mb=8", "accum mb=5"]
    rows = table(text, header, min_rows=1)
    assert [row[0] for row in rows] == ["0"]
    for row in rows:
        accuracies = [number(cell) for cell in row[1:4] + row[5:7]]
        # Held-out accuracies: a count of the 400 pairs, in [0, 1].
        assert all(
            0 <= a <= 1 and abs(a * 400 - round(a * 400)) < 1e-6 for a in accuracies
        )
        # What the experiment shows: accumulation's accuracy and lambda do not
        # depend on the minibatch size; under SGD its parameters agree to
        # round-off; imitation's parameters drift with the minibatch size.
        assert row[1] == row[2] == row[3], row
        adamw, sgd = (number(cell) for cell in row[4].split(" / "))
        assert 0 <= sgd < 1e-4 and adamw >= 0, row
        lambdas = row[8].split(" / ")
        assert len(lambdas) == 3 and len(set(lambdas)) == 1, row
        assert number(lambdas[0]) > 0, row
        assert number(row[7]) > 1e-3, row
        assert all(number(cell) > 0 for cell in row[9].split(" / ")), row
    assert_made_by(text, "parity.py")


def test_atari_reward_memory(tmp_path):
    run_script("atari_reward_memory.py", tmp_path, "--quick")
    text = read(tmp_path / "atari_reward_memory_84x84x4.md")
    header = ["minibatch", "estimate GiB", "peak allocated GiB (peak RSS)"]
    rows = table(text, header, min_rows=2)
    assert [row[0] for row in rows] == ["2", "4"]
    assert_made_by(text, "atari_reward_memory.py")
    rows_json = made_by_json(
        tmp_path / "atari_reward_memory_84x84x4.json", "atari_reward_memory.py"
    )
    assert [r["minibatch"] for r in rows_json] == [2, 4]


# gpu_check.sh: its syntax, and its checks on the CPU ---------------------------


def bash() -> str:
    path = shutil.which("bash")
    if path is None:
        pytest.skip("no bash")
    return path


def test_gpu_check_syntax_and_usage():
    run([bash(), "-n", "experiments/gpu_check.sh"])
    assert "--device cpu" in run([bash(), "experiments/gpu_check.sh", "--help"])
    done = subprocess.run(
        [bash(), "experiments/gpu_check.sh", "--no-such-option"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "unknown option" in done.stderr


# Minutes on two cores: its benchmark and memory steps are those of
# test_gpu_bench.py's and test_bench_memory's quick runs, which run by default.
@pytest.mark.expensive
def test_gpu_check_quick_on_the_cpu(tmp_path):
    command = [bash(), "experiments/gpu_check.sh", "--quick", "--device", "cpu"]
    output = run([*command, "--out-dir", str(tmp_path)])
    assert "CHECK PASSED on the CPU" in output
    text = read(tmp_path / "gpu_check_cpu.md")
    checks = [line.strip() for line in text.splitlines() if line.startswith("    ")]
    assert len(checks) == 7, checks
    assert all(line.startswith(("ok ", "skip ")) for line in checks), checks
    assert "skip float16: CUDA only" in checks
    assert_made_by(text, "gpu_check.sh")
    memory = read(tmp_path / "memory_cpu.md")
    table(memory, ["point", "chunk (transitions)"], min_rows=3)
    assert_made_by(memory, "bench_memory.py")
    made_by_json(tmp_path / "memory_cpu.json", "bench_memory.py")
    assert_png(tmp_path / "memory_cpu.png", "bench_memory.py")


# A stand-in for imitation's source tree: one test that passes in both runs, one
# that passes only upstream (it sees the patched class), one that always errors;
# one that loads a hub expert (answered from the cache, a stand-in file here) and
# a model the script does not train (offline: the hub's error) and uses pytest's
# cache; and a scripts' module that imports ray, whose parallel and other tests
# the script deselects.
STAND_IN_TESTS = {
    "algorithms/test_preference_comparisons.py": """
import pytest
from imitation.algorithms import preference_comparisons as pc


def test_passes_everywhere():
    assert True


def test_upstream_class():
    assert pc.BasicRewardTrainer.__module__.startswith("imitation.")


@pytest.fixture
def expert():
    raise OSError("no model hub here")


def test_needs_the_hub(expert):
    pass
""",
    "algorithms/test_adversarial.py": """
import os

import huggingface_sb3
import pytest


def test_passes_everywhere():
    assert True


def test_hub_experts_are_local(pytestconfig):
    path = huggingface_sb3.load_from_hub(
        "HumanCompatibleAI/ppo-seals-CartPole-v0", "ppo-seals-CartPole-v0.zip"
    )
    assert open(path).read() == "stand-in"
    with pytest.raises(Exception, match="offline|connection|cannot find"):
        huggingface_sb3.load_from_hub(
            "HumanCompatibleAI/ppo-seals-Ant-v0", "ppo-seals-Ant-v0.zip"
        )
    cache = os.environ["IMITATION_ACCUM_EXPERT_CACHE"]
    assert str(pytestconfig.cache.makedir("experts")).startswith(cache)
""",
    "scripts/test_scripts.py": """
import ray.tune as tune

from imitation.scripts import parallel

SPACE = tune.choice([1, 2])


def test_train_adversarial():
    assert parallel.parallel_ex is not None


def test_transfer_learning():
    pass


def test_parallel_train_adversarial_custom_env():
    pass  # selected where ray is installed


def test_train_bc_main():
    raise AssertionError("deselected: not preference, adversarial or reward")
""",
}


def test_imitation_tests_counts_and_names_regressions(tmp_path):
    source = tmp_path / "imitation-1.0.1"
    (source / "tests").mkdir(parents=True)
    (source / "tests" / "__init__.py").write_text("")
    for name, text in STAND_IN_TESTS.items():
        (source / "tests" / name).parent.mkdir(exist_ok=True)
        (source / "tests" / name).parent.joinpath("__init__.py").write_text("")
        (source / "tests" / name).write_text(text)
    cache = tmp_path / "cache"
    for repo in ("ppo-seals-CartPole-v0", "ppo-Pendulum-v1"):
        expert = cache / f"HumanCompatibleAI--{repo}" / "model.zip"
        expert.parent.mkdir(parents=True)
        expert.write_text("stand-in")
    out = tmp_path / "out"
    args = ("--imitation", str(source), "--cache-dir", str(cache))
    run_script("imitation_tests.py", out, *args)
    text = read(out / "imitation_tests.md")
    rows = table(text, ["module", "upstream: passed / failed / error / skipped"], 3)
    assert rows[0][1:] == ["2 / 0 / 1 / 0", "1 / 1 / 1 / 0"]
    assert rows[1][1:] == ["2 / 0 / 0 / 0", "2 / 0 / 0 / 0"]
    assert rows[2][0].startswith("`tests/scripts/test_scripts.py` (`-k ")
    # imitation's parallel tests (Ray Tune) run only where ray is installed.
    scripts = "3 / 0 / 0 / 0" if importlib.util.find_spec("ray") else "2 / 0 / 0 / 0"
    assert rows[2][1:] == [scripts, scripts]
    assert "Tests that pass upstream but not patched: 1" in text
    assert "test_upstream_class`: failed" in text
    assert (cache / "pytest_cache").is_dir()


def test_imitation_tests_warms_the_shared_caches_first(tmp_path, monkeypatch):
    # A run that fills a cache inside a test fails it, upstream as patched
    # (test_trajectory_dataset_seeding, test_train_adversarial_sac): the
    # experts and imitation's cached expert rollouts exist before the runs.
    import gymnasium as gym
    import seals  # noqa: F401  (registers seals/CartPole-v0)
    from stable_baselines3 import PPO

    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    import imitation_tests

    source = tmp_path / "imitation-1.0.1"
    (source / "tests" / "algorithms").mkdir(parents=True)
    (source / "tests" / "algorithms" / "conftest.py").write_text("")
    cache = tmp_path / "cache"
    trained = []

    def expert_path(cache_dir, repo_id):
        trained.append(repo_id)
        path = cache_dir / repo_id.replace("/", "--") / "model.zip"
        if not path.is_file():  # an untrained policy rolls out all the same
            path.parent.mkdir(parents=True, exist_ok=True)
            env_id = "seals/CartPole-v0" if "CartPole" in repo_id else "Pendulum-v1"
            PPO("MlpPolicy", gym.make(env_id), n_steps=8, seed=0).save(path)
        return path

    monkeypatch.setattr(imitation_tests, "expert_path", expert_path)
    folder, env_id, _ = imitation_tests.EXPERT_TRAJECTORIES
    monkeypatch.setattr(imitation_tests, "EXPERT_TRAJECTORIES", (folder, env_id, 2))
    import huggingface_sb3

    # warm_caches points the hub's loader at the stand-ins; put it back after.
    monkeypatch.setattr(huggingface_sb3, "load_from_hub", huggingface_sb3.load_from_hub)
    imitation_tests.warm_caches(source, cache)
    assert trained[: len(imitation_tests.EXPERTS)] == list(imitation_tests.EXPERTS)
    rollouts = cache / "pytest_cache" / "d" / "experts" / "seals-CartPole-v0"
    assert (rollouts / "rollout").exists()
