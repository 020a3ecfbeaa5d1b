"""imitation 1.0.1's own tests, run on imitation alone and under ``patch()``.

imitation's source distribution holds its tests; this runs its test modules for
preference comparisons and adversarial training twice, in fresh processes:
upstream (imitation's classes) and patched (``imitation_accum.patch()`` applied
for the whole session by a pytest plugin), offline (``HF_HUB_OFFLINE=1``: tests
that need experts from the model hub error in both runs). It writes one table:
per module, the counts of each outcome in both runs, and every test that passes
upstream but not patched.

Usage::

    pip download imitation==1.0.1 --no-deps --no-binary :all: -d /tmp/sdist
    tar xzf /tmp/sdist/imitation-1.0.1.tar.gz -C /tmp/sdist
    python experiments/imitation_tests.py --imitation /tmp/sdist/imitation-1.0.1
    python experiments/imitation_tests.py --imitation DIR --quick   # a few tests

It writes ``imitation_tests.md`` to ``--out-dir`` (default: ``docs/results/``, or
``output/experiments/`` with ``--quick``).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple
from xml.etree import ElementTree

import _results

MODULES = (
    "tests/algorithms/test_preference_comparisons.py",
    "tests/algorithms/test_adversarial.py",
)
#: ``-k`` expression of the quick mode: a handful of fast tests of each module.
QUICK = (
    "test_trainer_no_crash or test_gradient_accumulation or test_train_disc_no_crash"
)

PLUGIN = '''"""Applies imitation_accum.patch() for the whole pytest session."""


def pytest_configure(config):
    import imitation_accum

    imitation_accum.patch()
'''


def run(imitation: Path, module: str, patched: bool, quick: bool) -> Dict[str, str]:
    """Runs one test module; returns each test's outcome."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        plugin = Path(tmp) / "imitation_accum_session_patch.py"
        plugin.write_text(PLUGIN)
        command = [
            sys.executable,
            "-m",
            "pytest",
            module,
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            f"--junitxml={report}",
        ]
        if quick:
            command += ["-k", QUICK]
        if patched:
            command += ["-p", plugin.stem]
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=tmp)
        subprocess.run(command, cwd=imitation, env=env, check=False)
        return outcomes(report)


def outcomes(report: Path) -> Dict[str, str]:
    """``test id -> passed | failed | error | skipped`` from a JUnit XML report."""
    result: Dict[str, str] = {}
    if not report.exists():
        return result
    for case in ElementTree.parse(report).iter("testcase"):
        node = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            result[node] = "error"
        elif "failure" in kinds:
            result[node] = "failed"
        elif "skipped" in kinds:
            result[node] = "skipped"
        else:
            result[node] = "passed"
    return result


def counts(results: Dict[str, str]) -> str:
    kinds = ("passed", "failed", "error", "skipped")
    return " / ".join(str(sum(v == k for v in results.values())) for k in kinds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imitation", type=Path, required=True, help="sdist root")
    parser.add_argument("--quick", action="store_true", help="a few tests only")
    _results.add_out_dir(parser)
    args = parser.parse_args()
    out_dir = _results.resolve_out_dir(args)
    rows: List[str] = []
    regressions: List[Tuple[str, str]] = []
    for module in MODULES:
        upstream = run(args.imitation, module, patched=False, quick=args.quick)
        patched = run(args.imitation, module, patched=True, quick=args.quick)
        rows.append(f"| `{module}` | {counts(upstream)} | {counts(patched)} |")
        regressions += [
            (node, patched.get(node, "not run"))
            for node, outcome in upstream.items()
            if outcome == "passed" and patched.get(node) != "passed"
        ]
    lines = [
        "# imitation 1.0.1's tests, upstream and under `imitation_accum.patch()`",
        "",
        "| module | upstream: passed / failed / error / skipped | patched: "
        "passed / failed / error / skipped |",
        "|---|---|---|",
        *rows,
        "",
        f"Tests that pass upstream but not patched: {len(regressions)}",
        *[f"- `{node}`: {outcome}" for node, outcome in regressions],
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "imitation_tests.md"
    path.write_text(_results.with_made_by("\n".join(lines)))
    print(path.read_text())


if __name__ == "__main__":
    main()
