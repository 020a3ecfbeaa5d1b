"""Smoke test of ``experiments/gpu_bench.py --quick --device cpu``.

The table's GPU figures need a GPU; this checks that the script runs and writes
every row, so that it is known to work before a device run. Its figures mean
nothing and are not checked.
"""

import json
import re
import subprocess
import sys

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
