"""Runs a preference-comparison or AIRL/GAIL run that may kill itself, as ``kill -9``.

    python -m tests.scripts.resume_driver LOG_DIR CONFIG_JSON [KILL_AT]

``CONFIG_JSON``: the config updates (with the ``fast`` named config); its key
``"command"``, if there, is popped: ``airl`` or ``gail`` runs ``train_adversarial``
(else ``train_preference_comparisons`` runs). ``KILL_AT``: the
process sends itself SIGKILL at the KILL_AT-th file operation (``fsync``, rename,
directory removal) of its checkpoint writes, so inside a write or between its steps.
SIGTERM stops it as it stops the command line (exit status 143).
"""

import functools
import json
import os
import shutil
import signal
import sys
from typing import Any, Callable

from imitation_accum.io import run_checkpoint
from imitation_accum.scripts import (
    experiment,
    train_adversarial,
    train_preference_comparisons,
)

_writing = [False]
_operations = [0]


def _counted(operation: Callable[..., Any], kill_at: int) -> Callable[..., Any]:
    @functools.wraps(operation)
    def counted(*args: Any, **kwargs: Any) -> Any:
        if _writing[0]:
            _operations[0] += 1
            if _operations[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return operation(*args, **kwargs)

    return counted


def _marking(write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(write)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _writing[0] = True
        try:
            return write(*args, **kwargs)
        finally:
            _writing[0] = False

    return marked


def main() -> None:
    log_dir, updates = sys.argv[1], json.loads(sys.argv[2])
    if len(sys.argv) > 3:
        kill_at = int(sys.argv[3])
        for module, name in [
            (os, "fsync"),
            (os, "rename"),
            (os, "replace"),
            (shutil, "rmtree"),
        ]:
            setattr(module, name, _counted(getattr(module, name), kill_at))
        run_checkpoint.write = _marking(run_checkpoint.write)  # type: ignore
    experiment.stop_on_signals()
    updates["logging"] = {**updates.get("logging", {}), "log_dir": log_dir}
    command = updates.pop("command", None)
    if command is None:
        ex = train_preference_comparisons.train_preference_comparisons_ex
    else:
        ex = train_adversarial.train_adversarial_ex
    ex.run(command_name=command, named_configs=["fast"], config_updates=updates)
    experiment.exit_if_stopped()


if __name__ == "__main__":
    main()
