"""Smoke test of ``experiments/two_pass_drift.py --quick``: two passes, same update."""

import re
import subprocess
import sys

from tests.test_experiments import REPO, environment


def test_quick_run_splits_pairs_and_stays_on_the_one_pass_update(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "experiments/two_pass_drift.py",
            "--quick",
            "--steps",
            "2",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    text = (tmp_path / "two_pass_drift.md").read_text()
    rows = re.findall(
        r"^\| \w+ \| (AdamW|SGD) \| ([^|]+) \| (True|False) \| ([^|]+) \|", text, re.M
    )
    assert len(rows) == 12, text
    for _optimizer, variant, two_pass, difference in rows:
        assert (two_pass == "True") == variant.startswith("two passes"), text
        assert float(difference) < 1e-5, text  # 2 steps: round-off only
    assert re.search(r"^Made by: `python experiments/two_pass_drift\.py ", text, re.M)
