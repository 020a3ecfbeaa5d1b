"""Running this package's experiments in tests, and reading what they wrote."""

import csv
import math
import os
import pathlib
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Sequence

import sacred
import torch as th


def run(
    ex: sacred.Experiment,
    tmp_path: pathlib.Path,
    named_configs: Sequence[str] = (),
    config_updates: Optional[Mapping[str, Any]] = None,
    command_name: Optional[str] = None,
) -> sacred.run.Run:
    """Runs ``ex`` logging to CSV under ``tmp_path``; the run must complete."""
    updates: Dict[str, Any] = {
        "logging": {"log_root": str(tmp_path), "log_format_strs": ["csv"]},
    }
    for key, value in (config_updates or {}).items():
        if value == {}:
            continue
        if isinstance(value, dict) and isinstance(updates.get(key), dict):
            updates[key] = {**updates[key], **value}
        else:
            updates[key] = value
    run = ex.run(
        command_name=command_name,
        named_configs=list(named_configs),
        config_updates=updates,
    )
    assert run.status == "COMPLETED"
    return run


def run_command(cwd: pathlib.Path, command: Sequence[str], timeout_s: float) -> str:
    """Runs ``command`` in ``cwd``; it must succeed. Returns stdout and stderr."""
    done = subprocess.run(
        list(command),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


def log_dir(run: sacred.run.Run) -> pathlib.Path:
    return pathlib.Path(run.config["logging"]["log_dir"])


def progress(run: sacred.run.Run) -> List[Dict[str, float]]:
    """The rows the run's logger wrote to ``log/progress.csv``."""
    with open(log_dir(run) / "log" / "progress.csv") as f:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)}
            for row in csv.DictReader(f)
        ]


def assert_finite_losses(rows: List[Dict[str, float]], key_part: str) -> int:
    """Every value logged under a key containing ``key_part`` is finite."""
    values = [v for row in rows for k, v in row.items() if key_part in k]
    assert values, f"no logged key contains {key_part!r}"
    assert all(math.isfinite(v) for v in values), values
    return len(values)


def largest_memory_bytes() -> int:
    """The most memory a device of this machine has, host or GPU."""
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    gpus = range(th.cuda.device_count() if th.cuda.is_available() else 0)
    return max([host, *(th.cuda.get_device_properties(i).total_memory for i in gpus)])
