"""Regenerates every table and plot under ``docs/results/``: one command.

Each step runs one experiment script as a subprocess of this interpreter, from the
repository root, with settings sized so that the whole default set takes about
45 minutes on 2 quiet cores (some steps run fewer repeats or seeds than their
script's default; see :data:`STEPS` and docs/benchmarks.md). Every step's
command and time are printed; a step that fails does not stop the others, and the
run exits 1 if any failed. A step whose script is absent from this checkout is
skipped with a message.

Usage::

    python experiments/run_all.py                      # every default step
    python experiments/run_all.py --quick              # each script's --quick
    python experiments/run_all.py --only parity,memory # a subset
    python experiments/run_all.py --skip learning_results
    python experiments/run_all.py --list               # the steps, run nothing
    python experiments/run_all.py --timing-steps       # their names, for --only
    python experiments/run_all.py --only imitation_tests --imitation DIR

Without ``--out-dir``, a full run writes to ``docs/results/`` (the committed
files) and a ``--quick`` run to ``output/experiments/``, which git ignores;
``--out-dir DIR`` is passed on to every step. ``imitation_tests`` is not in the
default set: it needs imitation 1.0.1's unpacked source distribution
(``--imitation DIR``) and about 60 CPU-minutes; ask for it with ``--only``.
"""

import argparse
import dataclasses
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import _results

EXPERIMENTS = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Step:
    """One experiment script and its arguments, full and quick.

    ``{out}`` in an argument stands for the output directory. ``--out-dir`` is
    added to every step's arguments unless ``out_dir_option`` is False (the step
    names its files with ``{out}`` instead).
    """

    name: str
    script: str
    full: Tuple[str, ...] = ()
    quick: Tuple[str, ...] = ("--quick",)
    timing: bool = False  # its figures are timings (regenerated on a quiet machine)
    default: bool = True  # in the default set
    minutes: Optional[float] = None  # expected on 2 quiet cores (full settings)
    out_dir_option: bool = True

    def command(
        self, quick: bool, out_dir: Optional[Path], imitation: Optional[Path]
    ) -> List[str]:
        """The step's command line (the interpreter first).

        Args:
            quick: The script's quick arguments, else its full ones.
            out_dir: Passed on as ``--out-dir``; None: the script's default
                (``{out}`` then stands for that default).
            imitation: imitation 1.0.1's source tree (``imitation_tests`` only).

        Returns:
            The command, to run from the repository root.
        """
        out = _shown(out_dir or _results.default_out_dir(quick))
        args = [a.format(out=out) for a in (self.quick if quick else self.full)]
        if self.name == "imitation_tests":
            args += ["--imitation", str(imitation)]
        if self.out_dir_option and out_dir is not None:
            args += ["--out-dir", out]
        return [sys.executable, str(Path("experiments") / self.script), *args]


def _shown(path: Path) -> str:
    """``path`` relative to the repository root, if inside it, else absolute.

    The steps run in the repository root, and their ``Made by:`` lines show it.
    """
    path = path.resolve()
    if path.is_relative_to(_results.REPO_ROOT):
        return str(path.relative_to(_results.REPO_ROOT))
    return str(path)


#: Every step, in the order they run. The timing steps come last, so that a run
#: of everything measures them after the rest has finished.
STEPS: Tuple[Step, ...] = (
    Step("memory", "bench_memory.py", minutes=7),
    Step(
        "memory_issue506",
        "bench_memory.py",
        full=("--series=", "--issue-506", "--out", "{out}/memory_issue506"),
        quick=("--quick", "--series=", "--issue-506", "--out", "{out}/memory_issue506"),
        out_dir_option=False,
        minutes=7,
    ),
    Step("parity", "parity.py", ("--seeds", "3"), minutes=5),
    Step(
        "reward_trainer_memory",
        "bench_reward_trainer.py",
        ("--memory",),
        ("--memory", "--quick"),
        minutes=2,
    ),
    Step("two_pass_drift", "two_pass_drift.py", ("--steps", "46"), minutes=1.5),
    Step("frame_store_verify", "frame_store_verify.py", minutes=2),
    Step("checkpoint_cost", "bench_checkpoint_cost.py", minutes=4),
    Step("rollout_reward", "bench_rollout_reward.py", ("--seeds", "1"), minutes=1.5),
    Step("learning_results", "learning_results.py"),
    Step(
        "forward_size",
        "bench_forward_size.py",
        ("--busy", "--repeats", "1"),
        timing=True,
        minutes=8,
    ),
    Step(
        "reward_trainer",
        "bench_reward_trainer.py",
        ("--busy", "--repeats", "1"),
        timing=True,
        minutes=10,
    ),
    Step(
        "reward_trainer_same_process",
        "bench_reward_trainer.py",
        ("--same-process", "--repeats", "3"),
        ("--same-process", "--quick"),
        timing=True,
        minutes=3,
    ),
    Step(
        "discriminator",
        "bench_discriminator.py",
        ("--minibatches", "64", "16", "4"),
        timing=True,
        minutes=3,
    ),
    Step(
        "distributed",
        "bench_distributed.py",
        ("--processes", "1", "2"),
        timing=True,
        minutes=2,
    ),
    Step("imitation_tests", "imitation_tests.py", default=False, minutes=60),
)


def _names(value: str) -> List[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def select(
    steps: Sequence[Step], only: Optional[str], skip: Optional[str]
) -> List[Step]:
    """The steps ``--only`` and ``--skip`` leave, in :data:`STEPS`' order.

    Raises:
        ValueError: A name in ``only`` or ``skip`` names no step; the message
            names the option.
    """
    known = {step.name for step in steps}
    for option, value in (("--only", only), ("--skip", skip)):
        unknown = [n for n in _names(value or "") if n not in known]
        if unknown:
            raise ValueError(
                f"{option}: no step named {', '.join(unknown)}; the steps are "
                + ", ".join(step.name for step in steps)
            )
    wanted = set(_names(only)) if only else {s.name for s in steps if s.default}
    wanted -= set(_names(skip or ""))
    return [step for step in steps if step.name in wanted]


def run_step(step: Step, command: Sequence[str]) -> Tuple[str, float]:
    """Runs ``command`` from the repository root: (``ok``/``failed``/``skipped``, s)."""
    script = EXPERIMENTS / step.script
    if not script.is_file():
        print(
            f"== {step.name}: skipped: experiments/{step.script} does not exist in "
            "this checkout",
            flush=True,
        )
        return "skipped", 0.0
    shown = shlex.join(["python", *command[1:]])
    print(f"== {step.name}: {shown}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(list(command), cwd=_results.REPO_ROOT, check=False)
    seconds = time.perf_counter() - start
    status = "ok" if done.returncode == 0 else "failed"
    print(
        f"== {step.name}: {status} in {seconds:.0f} s"
        + ("" if done.returncode == 0 else f" (exit code {done.returncode})"),
        flush=True,
    )
    return status, seconds


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="each script's --quick (a few minutes)"
    )
    parser.add_argument("--only", metavar="NAME,...", help="run these steps only")
    parser.add_argument("--skip", metavar="NAME,...", help="leave these steps out")
    parser.add_argument(
        "--list", action="store_true", help="print the steps' commands; run nothing"
    )
    parser.add_argument(
        "--timing-steps",
        action="store_true",
        help="print the names of the timing steps, comma-separated, for --only",
    )
    parser.add_argument(
        "--imitation",
        type=Path,
        metavar="DIR",
        help="imitation 1.0.1's unpacked source distribution (imitation_tests)",
    )
    _results.add_out_dir(parser)
    args = parser.parse_args(argv)
    given_out_dir = args.out_dir  # passed on only if given
    _results.resolve_out_dir(args)
    if args.timing_steps:
        print(",".join(step.name for step in STEPS if step.timing))
        return 0
    try:
        steps = select(STEPS, args.only, args.skip)
    except ValueError as error:
        parser.error(str(error))
    if any(s.name == "imitation_tests" for s in steps) and args.imitation is None:
        parser.error(
            "--imitation: the imitation_tests step needs imitation 1.0.1's unpacked "
            "source distribution (see docs/benchmarks.md)"
        )
    commands = [
        (step, step.command(args.quick, given_out_dir, args.imitation))
        for step in steps
    ]
    if args.list:
        for step, command in commands:
            expected = ""
            if not args.quick:
                about = "?" if step.minutes is None else f"{step.minutes:g}"
                expected = f"  # about {about} min"
            print(f"{step.name}: {shlex.join(['python', *command[1:]])}{expected}")
        return 0
    results: Dict[str, Tuple[str, float]] = {}
    start = time.perf_counter()
    for step, command in commands:
        results[step.name] = run_step(step, command)
    total = time.perf_counter() - start
    print("\n| step | status | seconds |\n|---|---|---|")
    for name, (status, seconds) in results.items():
        print(f"| {name} | {status} | {seconds:.0f} |")
    print(f"\nTotal: {total:.0f} s; results in {args.out_dir}")
    failed = [name for name, (status, _) in results.items() if status == "failed"]
    if failed:
        print(f"Failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
