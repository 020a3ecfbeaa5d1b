"""Smoke test of ``experiments/gpu_bench.py --quick --device cpu``.

The table's GPU figures need a GPU; this checks that the script runs and writes
every row, so that it is known to work before a device run. The figures of a
quick CPU run mean nothing as measurements; what is checked is that each row's
figures agree with one another and with the JSON record (frames/s is the
batch's frames over the step's time, "vs bare" the bare row's time over the
row's, for the same update and minibatch).
"""

import json
import re
import subprocess
import sys

import pytest

from tests.test_experiments import REPO, environment, read, run

PREFERENCE_ROWS = [
    "bare",
    "bare_host",
    "package",
    "+pinned_staging",
    "+channels_last",
    "+cudnn_benchmark",
    "+compile",
    "+bf16",
    "+all",
]
DISCRIMINATOR_ROWS = [row for row in PREFERENCE_ROWS if row != "+bf16"]


def table_rows(text):
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| update")
    ]


def test_quick_run_on_the_cpu_writes_every_row(tmp_path):
    script = "experiments/gpu_bench.py"
    run(
        [
            sys.executable,
            script,
            "--quick",
            "--device",
            "cpu",
            "--out-dir",
            str(tmp_path),
        ]
    )
    text = read(tmp_path / "gpu_bench_cpu.md")
    assert "| update | minibatch | row | frames/s | ms/step | vs bare |" in text
    rows = table_rows(text)
    assert [r[2] for r in rows if r[0] == "preference"] == PREFERENCE_ROWS
    assert [r[2] for r in rows if r[0] == "discriminator"] == DISCRIMINATOR_ROWS
    for row in rows:
        assert float(row[3]) > 0 and float(row[4]) > 0, row
    assert [r[5] for r in rows if r[2] == "bare"] == ["1.00x", "1.00x"]
    assert re.search(
        r"^Made by: `python experiments/gpu_bench\.py --quick --device cpu --out-dir ",
        text,
        re.M,
    )
    data = json.loads((tmp_path / "gpu_bench_cpu.json").read_text())
    assert data["compile_backend"] == "aot_eager"
    assert all(row["status"] == "ok" for row in data["rows"])
    assert_figures_agree(rows, data)


def assert_figures_agree(rows, data):
    """Each Markdown row is its JSON row, and its figures follow from each other."""
    sizes = data["sizes"]
    frames = {
        "preference": 2 * sizes["pairs"] * sizes["length"],
        "discriminator": 2 * sizes["disc_batch"],
    }
    minibatches = {
        "preference": sizes["pair_minibatches"],
        "discriminator": sizes["disc_minibatches"],
    }
    records = data["rows"]
    assert len(records) == len(rows)
    bare = {
        (r["update"], r["minibatch"]): r["seconds_per_step"]
        for r in records
        if r["row"] == "bare"
    }
    assert len(bare) == sum(len(m) for m in minibatches.values())
    for row, record in zip(rows, records):
        update, minibatch = row[0], int(row[1])
        assert (record["update"], record["minibatch"], record["row"]) == (
            update,
            minibatch,
            row[2],
        )
        assert minibatch in minibatches[update], row
        seconds = record["seconds_per_step"]
        assert seconds > 0, record
        assert record["frames_per_second"] == pytest.approx(frames[update] / seconds)
        assert float(row[3]) == pytest.approx(frames[update] / seconds, abs=0.5)
        assert float(row[4]) == pytest.approx(1e3 * seconds, abs=0.05)
        ratio = bare[(update, minibatch)] / seconds
        assert row[5] == f"{ratio:.2f}x", (row, ratio)


def test_rows_past_the_time_limit_are_listed_as_not_run(tmp_path):
    command = [
        sys.executable,
        "experiments/gpu_bench.py",
        "--quick",
        "--device",
        "cpu",
        "--time-limit-s",
        "0",
        "--out-dir",
        str(tmp_path),
    ]
    done = subprocess.run(
        command,
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = table_rows(read(tmp_path / "gpu_bench_cpu.md"))
    assert len(rows) == len(PREFERENCE_ROWS) + len(DISCRIMINATOR_ROWS)
    assert all(row[3] == "not run (time limit)" for row in rows)
