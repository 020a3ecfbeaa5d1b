"""imitation's sacred experiments, configured and run with imitation patched.

Also what every run directory gets: a lock held by the running process, an atomic
``config.json``, logs that a resumed run continues and that a fresh run does not
overwrite, and a stop signal that always ends the run.
"""

import contextlib
import copy
import errno
import fcntl
import functools
import io
import logging
import multiprocessing.forkserver
import os
import pathlib
import re
import shlex
import signal
import sys
import textwrap
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

import sacred
from imitation.util import logger as imit_logger
from sacred.arg_parser import format_usage
from sacred.commands import help_for_command
from sacred.config.config_files import get_handler
from sacred.observers import FileStorageObserver
from sacred.utils import convert_to_nested_dict, ensure_wellformed_argv
from stable_baselines3.common import logger as sb_logger
from stable_baselines3.common import monitor

from imitation_accum.integrations.patching import patched
from imitation_accum.io import atomic
from imitation_accum.scripts import config_checks


class PatchedExperiment(sacred.Experiment):
    """A sacred experiment that configures and runs under ``imitation_accum.patched()``.

    Keys registered with :meth:`add_alternatives` (a minibatch size and a memory
    budget): a value the user gives for one clears the others a named config set,
    so ``with atari_pong algorithm_kwargs.minibatch_size=128`` overrides the named
    config's ``demo_minibatch_size`` instead of clashing with it.
    """

    # No __init__: sacred takes the experiment's docstring, main file and sources
    # from the frame that calls its constructor.

    #: Whether the run calls :func:`begin_record` once its inputs are checked and its
    #: run directory is locked (the main function, or the run-directory hook of
    #: :func:`derive`): its command line then records nothing of a run refused before.
    records_after_checks = False
    #: The run directory of the run under way (set once it is locked), which an
    #: interrupted command line names (:func:`interrupted_line`).
    run_directory: Optional[pathlib.Path] = None
    _held: Optional[contextlib.ExitStack] = None

    @functools.cached_property
    def alternatives(self) -> Dict[str, List[Tuple[str, ...]]]:
        """Section to groups of alternative keys (see :meth:`add_alternatives`)."""
        return {}

    @functools.cached_property
    def command_docs(self) -> Dict[str, str]:
        """Help of commands whose functions have no docstring (imitation's)."""
        return {}

    @functools.cached_property
    def update_hooks(self) -> List[Callable[[Dict[str, Any]], Dict[str, Any]]]:
        """Functions of the user's config updates (nested), run before sacred's config.

        Each returns the updates to use; one that raises refuses the run before
        sacred builds it (no run record, no file).
        """
        return []

    def add_alternatives(self, section: str, *names: str) -> None:
        """Declares the keys ``names`` of config ``section`` (a dict) alternatives."""
        self.alternatives.setdefault(section, []).append(tuple(names))

    def run_commandline(self, argv: Any = None) -> Optional[sacred.run.Run]:
        """Sacred's command line, where ``[COMMAND] --help`` prints help and exits 0."""
        argv = ensure_wellformed_argv(argv)
        words = [str(word) for word in argv[1:]]
        before_updates = words[: words.index("with")] if "with" in words else words
        if "-h" in before_updates or "--help" in before_updates:
            named = [w for w in before_updates if not w.startswith("-")]
            print(self.help_text(named[0] if named else None, argv[0]))
            sys.exit(0)
        return super().run_commandline(argv)

    def help_text(self, command: Optional[str], program: str) -> str:
        """The help of the experiment, or of ``command``; ``program`` is ``argv[0]``."""
        name = pathlib.Path(program).stem
        if program.endswith(".py"):  # python -m imitation_accum.scripts.NAME
            name = f"python -m {__package__}.{name}"
        commands = dict(self.gather_commands())
        if command is None:
            usage = format_usage(name, self.doc, commands, self.all_cli_options)
            return usage.replace(f"'{name}'", name)  # quoted for its spaces
        if command not in commands:
            return (
                f"{name}: no command {command!r}; the commands are: "
                f"{', '.join(sorted(commands))}"
            )
        described = command in self.command_docs and textwrap.fill(
            self.command_docs[command], 88
        )
        described = described or help_for_command(commands[command])
        return (
            f"Usage: {name} {command} [with UPDATE...] [options]\n\n"
            f"{described}\n\n"
            f"`{name} print_config` shows every config key and its value; "
            f"`{name} print_named_configs` the named configs."
        )

    def run(
        self,
        command_name: Optional[str] = None,
        config_updates: Optional[Mapping[str, Any]] = None,
        named_configs: Sequence[str] = (),
        *args: Any,
        **kwargs: Any,
    ) -> sacred.run.Run:
        """``sacred.Experiment.run`` with imitation patched and alternatives applied."""
        updates = user_alternatives_win(config_updates or {}, self.alternatives)
        for hook in self.update_hooks:
            updates = hook(updates)
        config_checks.check_known_keys(self, updates, named_configs)
        with patched(), self._own_keys_quiet(), contextlib.ExitStack() as held:
            self._held = held
            try:
                return super().run(
                    command_name, updates, named_configs, *args, **kwargs
                )
            finally:
                self._held = None

    def hold_while_running(self, manager: ContextManager[Any]) -> Any:
        """Enters ``manager`` until the current run ends (completed or failed)."""
        if self._held is None:
            raise RuntimeError("hold_while_running is for run hooks, during a run")
        return self._held.enter_context(manager)

    @functools.cached_property
    def own_sections(self) -> List[str]:
        """Sections our hooks check whole (sacred's new-key warnings there dropped)."""
        return []

    @contextlib.contextmanager
    def _own_keys_quiet(self) -> Iterator[None]:
        logger = self.logger or logging.getLogger()
        quiet = _OwnKeysFilter(self.own_sections)
        logger.addFilter(quiet)
        try:
            yield
        finally:
            logger.removeFilter(quiet)


class _OwnKeysFilter(logging.Filter):
    # Drops sacred's "Added new config entry" / "Changed type" for given sections.

    _PATTERN = re.compile(
        r'^(?:Added new config entry: |Changed type of config entry )"([^"]+)"'
    )

    def __init__(self, sections: Sequence[str]) -> None:
        super().__init__()
        self.sections = tuple(f"{section}." for section in sections)

    def filter(self, record: logging.LogRecord) -> bool:
        match = self._PATTERN.match(str(record.msg))
        return not (match and match.group(1).startswith(self.sections))


def user_alternatives_win(
    config_updates: Mapping[str, Any],
    alternatives: Mapping[str, Sequence[Tuple[str, ...]]],
) -> Dict[str, Any]:
    """``config_updates`` nested, the alternatives of each given key set to ``None``.

    sacred applies named configs under the user's updates, so this keeps a named
    config from setting them; two given values are left for the hooks to reject.
    """
    updates = copy.deepcopy(convert_to_nested_dict(dict(config_updates)))
    for section, groups in alternatives.items():
        given = updates.get(section)
        if not isinstance(given, dict):
            continue
        for group in groups:
            if any(given.get(name) is not None for name in group):
                for name in group:
                    given.setdefault(name, None)
    return updates


def derive(
    imitation_experiment: sacred.Experiment,
    doc: Optional[str] = None,
    run_directories: bool = True,
) -> PatchedExperiment:
    """A :class:`PatchedExperiment` copy of one of imitation's experiments.

    Same name, ingredients, configs, hooks and commands (``doc``: its ``--help``);
    what is added to it later leaves imitation's experiment as it is. With
    ``run_directories`` (an experiment with imitation's ``logging`` ingredient), a
    training command's run directory is locked, and refused if it holds an earlier
    run that ``resume_from`` does not continue, before the sacred record begins.
    """
    ex = PatchedExperiment(
        str(imitation_experiment.path), ingredients=imitation_experiment.ingredients
    )
    ex.doc = doc or imitation_experiment.doc
    ex.configurations.extend(imitation_experiment.configurations)
    ex.named_configs.update(imitation_experiment.named_configs)
    ex.config_hooks.extend(imitation_experiment.config_hooks)
    ex.captured_functions.extend(imitation_experiment.captured_functions)
    ex.pre_run_hooks.extend(imitation_experiment.pre_run_hooks)
    ex.post_run_hooks.extend(imitation_experiment.post_run_hooks)
    for name, command in imitation_experiment.commands.items():
        ex.commands.setdefault(name, command)
    ex.default_command = imitation_experiment.default_command
    if not run_directories:
        return ex
    ex.records_after_checks = True
    sacred_commands = set(sacred.Experiment("commands").commands)
    training = set(imitation_experiment.commands) - sacred_commands
    _add_run_directory_hooks(ex, training)
    return ex


def _add_run_directory_hooks(ex: PatchedExperiment, training: Set[str]) -> None:
    # Run hooks of the training commands (not of print_config and the like).

    def trains(run: sacred.run.Run) -> bool:
        return run.main_function.__name__ in training

    @ex.pre_run_hook
    def save_config(_run: sacred.run.Run, _log: logging.Logger) -> None:
        """Locks the run directory, begins the record, saves the config there.

        A run refused here (the directory in use, or holding an earlier run that
        this one does not resume) leaves no sacred record.
        """
        if not trains(_run):
            begin_record(_run)
            return
        log_dir = pathlib.Path(_run.config["logging"]["log_dir"])
        ex.hold_while_running(lock_run_directory(log_dir))
        ex.run_directory = log_dir
        if _run.config.get("resume_from") is None:
            refuse_earlier_run(log_dir, resume_from=log_dir)
        begin_record(_run)
        write_config(_run.config, log_dir)
        _log.info(f"Run directory: {log_dir.resolve()}")
        for observer in _run.observers:
            if isinstance(observer, FileStorageObserver) and observer.dir is not None:
                _log.info(f"Sacred run record: {pathlib.Path(observer.dir).resolve()}")
                break

    @ex.post_run_hook
    def report_run_directory(_run: sacred.run.Run, _log: logging.Logger) -> None:
        """Says where the results are."""
        if not trains(_run):
            return
        log_dir = pathlib.Path(_run.config["logging"]["log_dir"]).resolve()
        _log.info(
            f"Done. Run directory: {log_dir} (reward nets under checkpoints/, "
            "logs under log/, the config in config.json)"
        )


def main_console(ex: sacred.Experiment, observe: bool = True) -> None:
    """Runs ``ex``'s command line, recording runs under ``output/sacred/<name>/``.

    ``observe``: whether to record the run (only rank 0 does under ``torchrun``).
    A stop signal received during the run ends the process (see
    :func:`stop_on_signals`), even one that code of sacred swallowed.
    """
    if observe:
        root = pathlib.Path.cwd() / "output" / "sacred" / str(ex.path)
        ex.observers.append(record_observer(ex, root))
    if runs_main_or_own_command(sys.argv):
        workers_ignore_ctrl_c()
    try:
        ex.run_commandline()
    except KeyboardInterrupt:  # Ctrl-C: one line saying how to continue
        print(interrupted_line(ex, sys.argv), file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    exit_if_stopped()


def runs_main_or_own_command(argv: Sequence[str]) -> bool:
    """Whether a command line runs the experiment (not sacred's or help).

    ``print_config``, ``print_named_configs`` and sacred's other commands, and
    ``--help``, start no environment worker, so no forkserver either.
    """
    words = [str(word) for word in argv[1:]]
    before_updates = words[: words.index("with")] if "with" in words else words
    if "-h" in before_updates or "--help" in before_updates:
        return False
    return not (words and words[0] in sacred.Experiment("commands").commands)


def workers_ignore_ctrl_c() -> None:
    """Starts multiprocessing's forkserver with SIGINT ignored, for its children.

    SB3's ``SubprocVecEnv`` (imitation's ``environment.parallel=True``) starts its
    environment workers from the forkserver. A Ctrl-C reaches every process of the
    terminal's group: each worker printed its own ``KeyboardInterrupt`` traceback.
    Workers forked from this forkserver ignore it; the main process stops, and
    multiprocessing ends its (daemon) workers at exit.
    """
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted_line(ex: sacred.Experiment, argv: Sequence[str]) -> str:
    """What an interrupted command line prints: the intact checkpoint, how to resume.

    Args:
        ex: The experiment (its :attr:`PatchedExperiment.run_directory`).
        argv: The command line (``sys.argv``), repeated with ``resume_from=``.

    Returns:
        One line.
    """
    log_dir = getattr(ex, "run_directory", None)
    if log_dir is None:
        return "Interrupted before the run began: no run directory was written."
    from imitation_accum.io import run_checkpoint

    checkpoints = run_checkpoint.complete(run_checkpoint.root(log_dir))
    state = log_dir / "checkpoints" / "training_state.pt"  # train_reward_model's
    if checkpoints:
        intact, resume_from = checkpoints[-1], log_dir
    elif state.is_file():
        intact = resume_from = state
    else:
        return (
            f"Interrupted before the first checkpoint: {log_dir} holds nothing to "
            "resume; the same command starts a new run."
        )
    words = [w for w in argv[1:] if not w.startswith("resume_from=")]
    if "with" not in words:
        words.append("with")
    # AIRL/GAIL's replay buffer is a pickle: this run's own, so the command trusts it.
    from imitation_accum.adversarial.resumable import REPLAY_BUFFER

    if (intact / REPLAY_BUFFER).is_file() and "trust_pickle=True" not in words:
        words.append("trust_pickle=True")
    program = f"python -m {__package__}.{pathlib.Path(argv[0]).stem}"
    command = shlex.join([*program.split(), *words, f"resume_from={resume_from}"])
    return f"Interrupted; checkpoint {intact} is intact. Continue with: {command}"


def record_observer(ex: sacred.Experiment, root: pathlib.Path) -> FileStorageObserver:
    """The observer recording ``ex``'s runs under ``root``, as the command line's.

    A :class:`RecordAfterChecks` if ``ex.records_after_checks``, else sacred's own.
    """
    deferred = getattr(ex, "records_after_checks", False)
    observer_cls = RecordAfterChecks if deferred else FileStorageObserver
    return observer_cls(str(root))


# --- the run directory: lock, config, logs -----------------------------------

#: The lock file a running experiment holds in its run directory (with its pid).
LOCK_NAME = "run.lock"


class RunDirectoryInUseError(RuntimeError):
    """Another live process holds the run directory's lock."""


@contextlib.contextmanager
def lock_run_directory(
    log_dir: pathlib.Path, key: str = "logging.log_dir"
) -> Iterator[pathlib.Path]:
    """Holds ``log_dir``'s lock (created with the directory) while the context runs.

    ``fcntl.flock`` on ``log_dir/run.lock``, which holds this process's pid. The
    kernel releases it when the process ends, so a crashed run leaves no stale lock.

    Yields:
        The lock file's path.

    Raises:
        RunDirectoryInUseError: if a live process holds it, naming its pid and
            ``key`` (the config key of ``log_dir``).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            raise RunDirectoryInUseError(
                f"{key}={str(log_dir)!r} is in use by another run (pid "
                f"{holder or 'unknown'}, holding {str(path)!r}): wait for it to end, "
                f"or give another {key}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # no pid left behind; the kernel drops the lock
    finally:
        os.close(fd)


#: Log files a fresh run's logger opens for writing (emptying them), under ``log/``.
_LOG_FILES = ("progress.csv", "progress.json", "log.txt")


def earlier_run(log_dir: pathlib.Path) -> List[str]:
    """What an earlier run left in ``log_dir`` that a fresh run would overwrite.

    Non-empty logs (``log/`` and ``log/raw/``: ``progress.csv``, ``progress.json``,
    ``log.txt``; SB3's ``monitor/*.monitor.csv``) and any file under
    ``checkpoints/``. An empty ``run.lock`` or ``config.json`` alone is no run.

    Returns:
        Their paths relative to ``log_dir`` (``checkpoints/`` for checkpoints).
    """
    logs = [p for p in (log_dir / "log").rglob("*") if p.name in _LOG_FILES]
    logs += (log_dir / "monitor").glob("*.monitor.csv")
    found = [
        str(p.relative_to(log_dir))
        for p in sorted(logs)
        if p.is_file() and p.stat().st_size > 0
    ]
    checkpoints = log_dir / "checkpoints"
    if any(p.is_file() for p in checkpoints.rglob("*")):
        found.append("checkpoints/")
    return found


def refuse_earlier_run(
    log_dir: pathlib.Path,
    resume_from: Optional[pathlib.Path] = None,
    key: str = "logging.log_dir",
) -> None:
    """Refuses a fresh run in ``log_dir`` holding an earlier run (:func:`earlier_run`).

    SB3's logger opens ``progress.csv`` and ``log.txt`` for writing, which would
    empty the earlier run's. imitation's default ``log_dir`` is timestamped, so
    only a directory given again meets this. Called with the directory locked.

    Args:
        log_dir: The run directory.
        resume_from: What ``resume_from`` would continue the earlier run from, for
            the message; ``None`` if it cannot be continued.
        key: The config key of ``log_dir``.

    Raises:
        ValueError: naming ``key`` and the earlier run's files.
    """
    found = earlier_run(log_dir)
    if not found:
        return
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if found[3:] else "")
    resume = ""
    if resume_from is not None:
        resume = f"pass resume_from={str(resume_from)!r} to continue it, or "
    raise ValueError(
        f"{key}={str(log_dir)!r} holds an earlier run ({shown}), which a new run "
        f"would overwrite: {resume}give another {key}"
    )


def write_config(config: Mapping[str, Any], log_dir: pathlib.Path) -> pathlib.Path:
    """Writes ``config`` to ``log_dir/config.json`` atomically (as sacred writes it)."""
    handler = get_handler("config.json")
    text = io.StringIO()
    handler.dump(config, text)
    encoded = text.getvalue().encode()
    return atomic.atomic_write(log_dir / "config.json", lambda f: f.write(encoded))


def configure_logger(
    folder: pathlib.Path, format_strs: Sequence[str], append: bool
) -> imit_logger.HierarchicalLogger:
    """The imitation logger in ``folder``; with ``append``, continuing its files.

    SB3's formats open ``progress.csv``, ``progress.json`` and ``log.txt`` for
    writing, which empties a resumed run's logs; these continue them (the CSV
    header kept once), also under ``raw/``. Other formats are imitation's.
    """
    if not append:
        return imit_logger.configure(folder=folder, format_strs=format_strs)
    formats = _appending_formats(folder, format_strs)
    return _AppendingLogger(
        sb_logger.Logger(str(folder), formats),
        [f for f in format_strs if f != "wandb"],
    )


def _appending_formats(
    folder: pathlib.Path, format_strs: Sequence[str]
) -> List[sb_logger.KVWriter]:
    folder.mkdir(parents=True, exist_ok=True)
    formats: List[sb_logger.KVWriter] = []
    for name in format_strs:
        if name == "csv":
            formats.append(AppendingCSVOutputFormat(str(folder / "progress.csv")))
        elif name == "json":
            formats.append(_AppendingJSONOutputFormat(str(folder / "progress.json")))
        elif name == "log":
            text = open(folder / "log.txt", "a")  # noqa: SIM115 (the format closes it)
            human = sb_logger.HumanOutputFormat(text, max_length=50)  # imitation's
            human.own_file = True
            formats.append(human)
        elif name == "wandb":
            formats.append(imit_logger.WandbOutputFormat())
        else:  # stdout, tensorboard (a new event file per run)
            formats.append(imit_logger.make_output_format(name, str(folder)))
    return formats


class AppendingCSVOutputFormat(sb_logger.CSVOutputFormat):
    """SB3's CSV format continuing an existing file: its header kept, rows added.

    A last row cut short (a killed process) is dropped. New keys extend the
    header as SB3 does (earlier rows padded).
    """

    def __init__(self, filename: str) -> None:
        if not os.path.isfile(filename) or os.path.getsize(filename) == 0:
            super().__init__(filename)
            return
        # SB3's own attributes, with "r+" rather than its "w+t" (its header
        # rewrite seeks to the start, so not "a").
        self.file = open(filename, "r+")  # noqa: SIM115 (closed by close())
        self.separator = ","
        self.quotechar = '"'
        lines = self.file.readlines()
        if not lines[-1].endswith("\n"):  # a row (or the header) cut short
            lines.pop()
            self.file.seek(0)
            self.file.truncate(sum(len(line.encode()) for line in lines))
        self.keys = lines[0].rstrip("\n").split(self.separator) if lines else []
        self.file.seek(0, os.SEEK_END)


class _AppendingJSONOutputFormat(sb_logger.JSONOutputFormat):
    # SB3's JSON lines format, appending ("a", not "w").
    def __init__(self, filename: str) -> None:
        self.file = open(filename, "a")  # noqa: SIM115 (closed by close())


class _AppendingLogger(imit_logger.HierarchicalLogger):
    # imitation's logger, its raw/ sub-loggers continuing their files too.

    @contextlib.contextmanager
    def accumulate_means(self, name: str) -> Iterator[None]:
        subdir = os.path.join(*self._accumulate_prefixes, name)
        if subdir not in self._cached_loggers:  # imitation's would open with "w"
            folder = pathlib.Path(str(self.default_logger.get_dir())) / "raw" / subdir
            formats = _appending_formats(folder, self.format_strs)
            self._cached_loggers[subdir] = sb_logger.Logger(str(folder), formats)
        with super().accumulate_means(name):
            yield


class AppendingMonitor(monitor.Monitor):
    """SB3's ``Monitor``, continuing its file (``override_existing=False``)."""

    def __init__(self, env: Any, filename: Optional[str] = None, **kwargs: Any):
        kwargs.setdefault("override_existing", False)
        super().__init__(env, filename, **kwargs)


@contextlib.contextmanager
def appending_run_logs(format_strs: Sequence[str]) -> Iterator[None]:
    """While open, imitation's scripts continue the logs of their run directory.

    imitation's ``setup_logging`` and SB3's ``Monitor`` (``monitor/*.monitor.csv``)
    open their files anew, emptying a resumed run's; inside the block the logger is
    :func:`configure_logger`'s appending one and monitors append.

    Args:
        format_strs: The run's ``logging.log_format_strs``.

    Yields:
        Nothing.
    """
    from imitation.scripts.ingredients import logging as logging_ingredient
    from imitation.scripts.ingredients import wb

    def setup_logging() -> Tuple[imit_logger.HierarchicalLogger, pathlib.Path]:
        log_dir = logging_ingredient.make_log_dir()
        if "wandb" in format_strs:  # as imitation's setup_logging does
            wb.wandb_init(log_dir=str(log_dir))
        return configure_logger(log_dir / "log", format_strs, True), log_dir

    swapped = [
        (logging_ingredient, "setup_logging", setup_logging),
        (monitor, "Monitor", AppendingMonitor),
    ]
    originals = [(module, name, getattr(module, name)) for module, name, _ in swapped]
    for module, name, value in swapped:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in originals:
            setattr(module, name, value)


# --- the sacred run record ---------------------------------------------------


class RecordAfterChecks(FileStorageObserver):
    """sacred's ``FileStorageObserver`` whose record begins at :func:`begin_record`.

    A run whose inputs are refused before then leaves no record (sacred would
    start one, and mark it FAILED, before the main function runs).
    """

    _pending: Optional[Dict[str, Any]] = None
    _begun = False

    def started_event(self, **event: Any) -> Optional[str]:  # type: ignore[override]
        """Keeps the start of the run for :meth:`begin`."""
        self._pending = event
        return None

    def begin(self) -> Optional[str]:
        """Writes the record's start; returns the run's id."""
        if self._pending is None:
            return None
        event, self._pending = self._pending, None
        self._begun = True
        return super().started_event(**event)

    # Events of a run whose record has not begun are dropped.

    def heartbeat_event(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self._begun:
            super().heartbeat_event(*args, **kwargs)

    def completed_event(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self._begun:
            super().completed_event(*args, **kwargs)

    def interrupted_event(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self._begun:
            super().interrupted_event(*args, **kwargs)

    def failed_event(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self._begun:
            super().failed_event(*args, **kwargs)

    def resource_event(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self._begun:
            super().resource_event(*args, **kwargs)

    def artifact_event(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self._begun:
            super().artifact_event(*args, **kwargs)

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        if self._begun:
            super().log_metrics(*args, **kwargs)


def begin_record(run: sacred.run.Run) -> None:
    """Begins ``run``'s deferred records (:class:`RecordAfterChecks`)."""
    for observer in run.observers:
        if isinstance(observer, RecordAfterChecks):
            run_id = observer.begin()
            if run._id is None and run_id is not None:
                run._id = run_id
                run.run_logger.info(f'Started run with ID "{run_id}"')


# --- stop signals ------------------------------------------------------------

#: Stop signals received since :func:`stop_on_signals` (the first one counts).
_received_signals: List[int] = []


def stop_on_signals(signums: Sequence[int] = (signal.SIGTERM,)) -> None:
    """Makes ``signums`` end the process with status 128 + the signal's number.

    The handler raises ``SystemExit`` (so ``finally`` blocks and the atomic write
    under way complete, :mod:`imitation_accum.io.atomic`) and records the signal:
    if a bare ``except`` swallowed that exit (sacred has some),
    :func:`exit_if_stopped` raises it again at the next safe point, and
    :func:`main_console` at the end of the command.
    """

    def stop(signum: int, frame: Any) -> None:
        _received_signals.append(signum)
        raise SystemExit(128 + signum)

    for signum in signums:
        signal.signal(signum, stop)


def exit_if_stopped() -> None:
    """Raises ``SystemExit(128 + signal)`` if a stop signal was received."""
    if _received_signals:
        raise SystemExit(128 + _received_signals[0])
