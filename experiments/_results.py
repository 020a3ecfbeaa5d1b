"""Where the experiments write their results, and the line naming what made them.

Every script under ``experiments/`` takes ``--out-dir DIR``. Without it, a full
run writes to ``docs/results/`` at the repository root, where the committed
tables live, and a ``--quick`` run to ``output/experiments/`` (ignored by git),
so that a quick run never overwrites the committed tables: :func:`add_out_dir`
adds the option and :func:`resolve_out_dir`, called right after parsing, picks
the directory. Each file a script writes ends with :func:`made_by`'s line: the
command line, the machine (host, processor, cores), torch's version and the
device.
"""

import argparse
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "docs" / "results"
QUICK_OUT_DIR = REPO_ROOT / "output" / "experiments"


def add_out_dir(parser: argparse.ArgumentParser) -> None:
    """Adds ``--out-dir DIR`` to ``parser``; see :func:`resolve_out_dir`."""
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="directory the results are written to (default: docs/results/ at the "
        "repository root, which holds the committed tables; with --quick, "
        "output/experiments/ there, which git ignores)",
    )


def default_out_dir(quick: bool) -> Path:
    """``output/experiments/`` for a quick run, else ``docs/results/``."""
    return QUICK_OUT_DIR if quick else DEFAULT_OUT_DIR


def resolve_out_dir(args: argparse.Namespace) -> Path:
    """Sets and returns ``args.out_dir``: as given, else by ``args.quick``.

    An explicit ``--out-dir`` always wins; without it a ``--quick`` run writes to
    :data:`QUICK_OUT_DIR` and a full run to :data:`DEFAULT_OUT_DIR`.
    """
    if args.out_dir is None:
        args.out_dir = default_out_dir(bool(getattr(args, "quick", False)))
    return args.out_dir


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """This process's command line, its script relative to the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else None
    if script is not None and script.is_relative_to(REPO_ROOT):
        argv[0] = str(script.relative_to(REPO_ROOT))
    return shlex.join(["python", *argv])


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> str:
    """The host, processor, core count, torch version and ``device``'s name."""
    import torch as th

    name = str(device)
    if name.startswith("cuda") and th.cuda.is_available():
        name = f"{name} ({th.cuda.get_device_name(th.device(name))})"
    threads = th.get_num_threads()
    return (
        f"{platform.node()} ({_cpu_model()}, {os.cpu_count()} CPUs, "
        f"{threads} torch thread{'' if threads == 1 else 's'}), "
        f"torch {th.__version__}, device {name}"
    )


def made_by(device: str = "cpu", command: Optional[str] = None) -> str:
    """``Made by: `python experiments/X.py ...` on <machine>``.

    Args:
        device: The device the figures were measured on.
        command: The command line; default: this process's (:func:`command_line`).
    """
    return f"Made by: `{command or command_line()}` on {machine(device)}"


def with_made_by(text: str, device: str = "cpu") -> str:
    """``text`` (Markdown), then a blank line and :func:`made_by`'s line."""
    return text.rstrip("\n") + "\n\n" + made_by(device) + "\n"
