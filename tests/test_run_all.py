"""``experiments/run_all.py``: which steps run, with which arguments, and how.

The real experiments are smoke-tested in tests/test_experiments.py; here stand-in
scripts (a few lines each, under ``tmp_path``) record the arguments they get, so
that the plumbing is checked in well under a second per test.
"""

import pathlib
import sys
from typing import List

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"

sys.path.insert(0, str(EXPERIMENTS))
try:
    import run_all
finally:
    sys.path.remove(str(EXPERIMENTS))

#: A stand-in experiment: writes its arguments to OUT_DIR/<its name>.args, then
#: exits with the code in its name's last character (``step0.py``: 0).
STAND_IN = """\
import pathlib, sys
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--out-dir") + 1])
name = pathlib.Path(__file__).stem
(out / (name + ".args")).write_text(" ".join(args))
sys.exit(int(name[-1]))
"""


def stand_ins(tmp_path: pathlib.Path, names: List[str]) -> List[run_all.Step]:
    steps = []
    for name in names:
        script = tmp_path / f"{name}.py"
        if not name.startswith("missing"):
            script.write_text(STAND_IN)
        steps.append(run_all.Step(name, str(script), full=("--full-arg",)))
    return steps


def test_quick_only_runs_the_steps_named_and_reports_failures(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    out.mkdir()
    steps = stand_ins(tmp_path, ["a0", "b1", "c0", "missing0"])
    monkeypatch.setattr(run_all, "STEPS", tuple(steps))
    code = run_all.main(["--quick", "--only", "a0,b1,missing0", "--out-dir", str(out)])
    printed = capsys.readouterr()
    assert code == 1  # b1 failed
    assert (out / "a0.args").read_text() == f"--quick --out-dir {out}"
    assert (out / "b1.args").is_file()
    assert not (out / "c0.args").exists()  # not asked for
    assert "== b1: failed in " in printed.out and "(exit code 1)" in printed.out
    assert "== a0: ok in " in printed.out
    assert "== missing0: skipped: " in printed.out and "does not exist" in printed.out
    assert "| missing0 | skipped | 0 |" in printed.out
    assert "Failed: b1" in printed.err


def test_full_run_skip_and_the_default_set(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    steps = stand_ins(tmp_path, ["a0", "c0"])
    steps.append(run_all.Step("d0", steps[0].script, default=False))
    monkeypatch.setattr(run_all, "STEPS", tuple(steps))
    assert run_all.main(["--skip", "c0", "--out-dir", str(out)]) == 0
    assert (out / "a0.args").read_text() == f"--full-arg --out-dir {out}"
    assert not (out / "c0.args").exists()
    assert "== d0" not in capsys.readouterr().out  # not in the default set


def test_bad_names_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    steps = stand_ins(tmp_path, ["a0"])
    monkeypatch.setattr(run_all, "STEPS", tuple(steps))
    for option in ("--only", "--skip"):
        with pytest.raises(SystemExit) as raised:
            run_all.main([option, "a0,nope", "--out-dir", str(tmp_path)])
        assert raised.value.code == 2
        assert f"{option}: no step named nope" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.args"))


def test_the_real_steps(capsys):
    """Every script named exists; imitation_tests is asked for by name.

    ``learning_results.py`` may be absent (it is skipped then); imitation_tests
    needs ``--imitation``.
    """
    names = [step.name for step in run_all.STEPS]
    assert len(set(names)) == len(names)
    for step in run_all.STEPS:
        if step.name != "learning_results":
            assert (EXPERIMENTS / step.script).is_file(), step.script
    assert run_all.main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    defaults = [step.name for step in run_all.STEPS if step.default]
    assert [line.split(":")[0] for line in listed] == defaults
    assert "imitation_tests" not in defaults
    # Without --out-dir the scripts' own default (docs/results/) is used, so the
    # committed files name the documented commands.
    (parity,) = [line for line in listed if line.startswith("parity: ")]
    assert parity.startswith("parity: python experiments/parity.py ")
    assert "--out-dir" not in parity
    assert run_all.main(["--timing-steps"]) == 0
    timing = capsys.readouterr().out.strip().split(",")
    assert timing == [step.name for step in run_all.STEPS if step.timing]
    assert "reward_trainer" in timing and "parity" not in timing
    with pytest.raises(SystemExit):
        run_all.main(["--only", "imitation_tests", "--list"])
    assert "--imitation: the imitation_tests step needs" in capsys.readouterr().err
