"""imitation's sacred experiments, configured and run with imitation patched."""

import contextlib
import copy
import functools
import logging
import pathlib
import re
import sys
import textwrap
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import sacred
from sacred.arg_parser import format_usage
from sacred.commands import help_for_command
from sacred.config import save_config_file
from sacred.observers import FileStorageObserver
from sacred.utils import convert_to_nested_dict, ensure_wellformed_argv

from imitation_accum.integrations.patching import patched


class PatchedExperiment(sacred.Experiment):
    """A sacred experiment that configures and runs under ``imitation_accum.patched()``.

    Keys registered with :meth:`add_alternatives` (a minibatch size and a memory
    budget): a value the user gives for one clears the others a named config set,
    so ``with atari_pong algorithm_kwargs.minibatch_size=128`` overrides the named
    config's ``demo_minibatch_size`` instead of clashing with it.
    """

    # No __init__: sacred takes the experiment's docstring, main file and sources
    # from the frame that calls its constructor.

    @functools.cached_property
    def alternatives(self) -> Dict[str, List[Tuple[str, ...]]]:
        """Section to groups of alternative keys (see :meth:`add_alternatives`)."""
        return {}

    @functools.cached_property
    def command_docs(self) -> Dict[str, str]:
        """Help of commands whose functions have no docstring (imitation's)."""
        return {}

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
        with patched(), self._own_keys_quiet():
            return super().run(command_name, updates, named_configs, *args, **kwargs)

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
    imitation_experiment: sacred.Experiment, doc: Optional[str] = None
) -> PatchedExperiment:
    """A :class:`PatchedExperiment` copy of one of imitation's experiments.

    Same name, ingredients, configs, hooks and commands (``doc``: its ``--help``);
    what is added to it later leaves imitation's experiment as it is.
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
    sacred_commands = set(sacred.Experiment("commands").commands)
    training = set(imitation_experiment.commands) - sacred_commands
    _add_run_directory_hooks(ex, training)
    return ex


def _add_run_directory_hooks(ex: sacred.Experiment, training: Set[str]) -> None:
    # Run hooks of the training commands (not of print_config and the like).

    def trains(run: sacred.run.Run) -> bool:
        return run.main_function.__name__ in training

    @ex.pre_run_hook
    def save_config(_run: sacred.run.Run, _log: logging.Logger) -> None:
        """Saves the config in the run directory and says where that is."""
        if not trains(_run):
            return
        log_dir = pathlib.Path(_run.config["logging"]["log_dir"])
        log_dir.mkdir(parents=True, exist_ok=True)
        save_config_file(_run.config, str(log_dir / "config.json"))
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
    """
    if observe:
        observer_path = pathlib.Path.cwd() / "output" / "sacred" / str(ex.path)
        ex.observers.append(FileStorageObserver(observer_path))
    ex.run_commandline()
