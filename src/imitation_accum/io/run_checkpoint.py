"""Checkpoints of online runs: one directory per checkpoint, complete or absent.

A run's checkpoints live in ``{log_dir}/checkpoints/resume/NNNNNN/`` (``N`` counts
completed iterations or rounds), each written by
:func:`imitation_accum.io.atomic.atomic_directory`. Its ``checkpoint.json``
records the experiment, the format version, the run's config and the size and
SHA-256 of every other file. Once a checkpoint is in place the older ones are
removed: a process killed at any moment leaves the last complete checkpoint.

A checkpoint may also need *shared* files beside the checkpoints, in a directory
that successive checkpoints grow in place (the preference store): the manifest's
``"shared"`` table records each one's committed size (the file may be longer).

``resume_from`` names a run directory (its latest checkpoint), a checkpoint
directory or its ``checkpoint.json``. A run directory with no checkpoint yet
resumes from the start, with the seed and config of its ``config.json``.
"""

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import shutil
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from sacred.config.config_files import get_handler

from imitation_accum.io import atomic
from imitation_accum.io.atomic import AnyPath

FORMAT = "imitation_accum.run_checkpoint"
#: Format version written and read; another version is refused, naming the file.
#: Version 1 kept the preference store inside each checkpoint (written whole).
VERSION = 2
#: The manifest of a checkpoint directory.
MANIFEST = "checkpoint.json"
#: Where a run directory keeps its checkpoints.
SUBDIRECTORY = pathlib.Path("checkpoints") / "resume"
#: The config file sacred's run hooks write into a run directory.
CONFIG = "config.json"
#: The key of ``write_files``' result that names shared files (see :func:`write`).
SHARED = "shared"


@dataclasses.dataclass(frozen=True)
class Located:
    """What ``resume_from`` names: a run directory and its latest checkpoint."""

    run_dir: pathlib.Path  # the run directory
    checkpoint: Optional[pathlib.Path]  # a checkpoint directory; None: start over
    manifest: Dict[str, Any]  # the checkpoint's manifest ({} without one)
    config: Dict[str, Any]  # the run's config, as sacred's config.json holds it


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Where and how a run checkpoints, and where it resumes from.

    Attributes:
        log_dir: The run directory (checkpoints under ``checkpoints/resume/``);
            ``None``: write none.
        config: The run's config in JSON form, recorded in each checkpoint.
        seed: The run's seed (environments that cannot be saved restart from it).
        resume_from: A checkpoint directory to continue from, or ``None``.
        interval: Iterations (rounds) between checkpoints; the last one always.
        trust_pickle: Load the pickles of a checkpoint other than its
            environments (the adversarial replay buffer); they run any code
            they hold.
    """

    log_dir: Optional[pathlib.Path]
    config: Mapping[str, Any]
    seed: int
    resume_from: Optional[pathlib.Path] = None
    interval: int = 1
    trust_pickle: bool = False


def root(log_dir: AnyPath) -> pathlib.Path:
    """The directory of ``log_dir``'s checkpoints."""
    return pathlib.Path(log_dir) / SUBDIRECTORY


def json_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """``config`` as sacred writes it to ``config.json`` (classes as ``py/type``)."""
    text = io.StringIO()
    get_handler(CONFIG).dump(config, text)
    return json.loads(text.getvalue())


def flatten(config: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested dicts as ``{"a.b": value}`` (sacred's ``py/`` objects kept whole).

    An empty dict holds no key: whether a section exists at all can depend on which
    of imitation's experiments a process imported (they share ingredients).
    """
    flat: Dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not any(str(k).startswith("py/") for k in value):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _shown(value: Any) -> str:
    # A JSON-form config value as Python would show it (tuples, classes).
    def plain(v: Any) -> Any:
        if isinstance(v, dict) and len(v) == 1 and "py/tuple" in v:
            return tuple(plain(x) for x in v["py/tuple"])
        if isinstance(v, dict) and len(v) == 1 and "py/type" in v:
            return _Name(v["py/type"])
        if isinstance(v, dict) and len(v) == 1 and "py/reduce" in v:
            # A path (pathlib reduces to its class and parts), shown as a string;
            # nothing is decoded (that could run code named in a checkpoint).
            cls, args = (plain(x) for x in v["py/reduce"][:2])
            if str(cls).startswith("pathlib.") and isinstance(args, tuple):
                return str(pathlib.PurePosixPath(*args))
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    return repr(plain(value))


class _Name(str):
    def __repr__(self) -> str:
        return str(self)


def _may_change(key: str, allowed: Sequence[str]) -> bool:
    return any(key == a or (a.endswith(".") and key.startswith(a)) for a in allowed)


def compare_configs(
    saved: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    may_change: Sequence[str],
    where: str,
    hint: str,
) -> List[Tuple[str, str, str]]:
    """Checks that ``config`` continues the run ``saved`` (both in JSON form).

    Args:
        saved: The checkpoint's config.
        config: The resuming run's config.
        may_change: Keys that may differ (``"logging."``: every key below it).
        where: What to call the checkpoint in a message.
        hint: Appended to the message (what to do).

    Returns:
        The keys that differ and may: ``(key, saved value, new value)``, the
        values as Python shows them.

    Raises:
        ValueError: naming the first key (sorted) that differs and may not.
    """
    old, new = flatten(saved), flatten(config)
    missing = object()
    allowed: List[Tuple[str, str, str]] = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, missing), new.get(key, missing)
        if before == after:
            continue
        if _may_change(key, may_change):
            absent = "(absent)"
            allowed.append(
                (
                    key,
                    absent if before is missing else _shown(before),
                    absent if after is missing else _shown(after),
                )
            )
            continue
        written = (
            f"without {key}" if before is missing else f"with {key}={_shown(before)}"
        )
        now = f"no {key}" if after is missing else f"{key}={_shown(after)}"
        raise ValueError(
            f"{where} was written {written}, but this run has {now}: a resumed run "
            f"must have the config of the run it continues{hint}"
        )
    return allowed


def _digest(path: pathlib.Path) -> Dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _size(path: pathlib.Path) -> Dict[str, Any]:
    # Files of a sub-directory (a frame store, which checks its own hashes).
    return {"bytes": path.stat().st_size}


def write(
    log_dir: AnyPath,
    count: int,
    *,
    experiment: str,
    command: str,
    config: Mapping[str, Any],
    write_files: Callable[[pathlib.Path], Mapping[str, Any]],
) -> pathlib.Path:
    """Writes checkpoint ``count`` of the run in ``log_dir``; removes the older ones.

    Args:
        log_dir: The run directory.
        count: Iterations (or rounds) completed; names the checkpoint.
        experiment: The experiment's name, checked on resume.
        command: The experiment's command that ran (``airl``, ``gail``).
        config: The run's config (JSON form, :func:`json_config`).
        write_files: Writes the checkpoint's files into the directory it is given
            and returns plain values kept as the manifest's ``"metadata"``; under
            :data:`SHARED`, the files it needs outside it (``"DIRECTORY/FILE"`` in
            the checkpoints' root, written and ``fsync``-ed) and their committed
            bytes. The manifest records every file's size, and the SHA-256 of those
            at the top (a frame store checks its own).

    Returns:
        The checkpoint's directory.
    """
    directory = root(log_dir)
    target = directory / f"{int(count):06d}"
    remove_partial(directory)
    if target.exists():  # a later one of a run resumed from an earlier one
        _discard(target)
    with atomic.atomic_directory(target) as temporary:
        metadata = dict(write_files(temporary))
        shared = {
            path: {"bytes": int(n_bytes)}
            for path, n_bytes in metadata.pop(SHARED, {}).items()
        }
        for path in shared:
            _check_shared_path(path, f"checkpoint {str(target)!r}")
        files = {
            path.relative_to(temporary).as_posix(): (
                _digest(path) if path.parent == temporary else _size(path)
            )
            for path in sorted(temporary.rglob("*"))
            if path.is_file()
        }
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "experiment": experiment,
            "command": command,
            "count": int(count),
            "config": dict(config),
            "files": files,
            "shared": shared,
            "metadata": metadata,
        }
        (temporary / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for older in complete(directory):
        if older != target:
            _discard(older)
    named = {path.split("/")[0] for path in shared}
    for path in directory.iterdir():
        if _is_shared_directory(path) and path.name not in named:
            _discard(path)
    return target


def _is_shared_directory(path: pathlib.Path) -> bool:
    # Neither a checkpoint nor a temporary: what a checkpoint's shared files are in.
    return (
        path.is_dir()
        and not path.is_symlink()
        and not path.name.isdigit()
        and not path.name.startswith(".")
    )


def _check_shared_path(path: Any, where: str) -> pathlib.PurePosixPath:
    """``path`` of a ``"shared"`` table: ``DIRECTORY/FILE`` inside the root.

    Raises:
        ValueError: naming ``where``, if it is anything else.
    """
    parts = pathlib.PurePosixPath(path).parts if isinstance(path, str) else ()
    if (
        len(parts) != 2
        or any(part in (".", "..") or "\\" in part for part in parts)
        or parts[0].isdigit()
        or parts[0].startswith(".")
        or path != "/".join(parts)
    ):
        raise ValueError(
            f"{where}: shared file {path!r} is not DIRECTORY/FILE in the "
            "checkpoints' directory"
        )
    return pathlib.PurePosixPath(path)


def _discard(checkpoint: pathlib.Path) -> None:
    # Renamed to a temporary name first: a process killed while removing it leaves
    # a partial directory, never a checkpoint that lacks files.
    doomed = atomic.temporary_sibling(checkpoint)
    os.rename(checkpoint, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_partial(directory: pathlib.Path) -> None:
    """Removes temporary directories of checkpoint writes that were killed."""
    if directory.is_dir():
        for stale in directory.glob(f".*{atomic.TEMPORARY_SUFFIX}"):
            shutil.rmtree(stale, ignore_errors=True)


def complete(directory: pathlib.Path) -> List[pathlib.Path]:
    """The checkpoint directories in ``directory`` (with a manifest), oldest first."""
    if not directory.is_dir():
        return []
    found = [
        path
        for path in directory.iterdir()
        if path.name.isdigit() and (path / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda path: int(path.name))


def remove_after(log_dir: AnyPath, count: int) -> List[pathlib.Path]:
    """Removes the checkpoints of ``log_dir`` after ``count`` (and partial ones)."""
    directory = root(log_dir)
    remove_partial(directory)
    removed = [p for p in complete(directory) if int(p.name) > count]
    for path in removed:
        _discard(path)
    return removed


def _read_json(path: pathlib.Path, what: str) -> Dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {what} {str(path)!r}: {error}") from error
    if not isinstance(value, dict):
        raise ValueError(f"{what} {str(path)!r} is not a JSON object")
    return value


def read_manifest(
    checkpoint: pathlib.Path, experiment: str, name: str
) -> Dict[str, Any]:
    """The manifest of ``checkpoint``, its files checked against it.

    Raises:
        ValueError: naming ``name`` and the file, if the manifest is unreadable,
            of another format, version or experiment, or a file is missing,
            truncated or altered.
    """
    path = checkpoint / MANIFEST
    manifest = _read_json(path, f"{name}: the checkpoint manifest")
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{name}: {str(path)!r} is not a checkpoint of imitation_accum"
        )
    if manifest.get("version") != VERSION:
        raise ValueError(
            f"{name}: {str(path)!r} has format version {manifest.get('version')!r}; "
            f"this version of imitation_accum reads version {VERSION}"
        )
    if manifest.get("experiment") != experiment:
        raise ValueError(
            f"{name}: {str(checkpoint)!r} is a checkpoint of "
            f"{manifest.get('experiment')!r}, not of {experiment}"
        )
    for file_name, recorded in manifest.get("files", {}).items():
        file = checkpoint / file_name
        if not file.is_file():
            raise ValueError(f"{name}: {str(file)!r} is missing")
        size = file.stat().st_size
        if size != recorded["bytes"]:
            raise ValueError(
                f"{name}: {str(file)!r} is truncated or altered ({size} bytes, the "
                f"manifest records {recorded['bytes']})"
            )
        if "sha256" in recorded and _digest(file)["sha256"] != recorded["sha256"]:
            raise ValueError(
                f"{name}: {str(file)!r} is altered (its SHA-256 differs from the "
                "manifest's)"
            )
    shared = manifest.get("shared", {})
    if not isinstance(shared, dict):
        raise ValueError(f"{name}: {str(path)!r} has a 'shared' that is not a table")
    for file_name, recorded in shared.items():
        file = checkpoint.parent / _check_shared_path(file_name, f"{name}: {path}")
        if file.is_symlink() or not file.is_file():
            raise ValueError(
                f"{name}: {str(file)!r}, which the checkpoint needs, is missing"
            )
        size = file.stat().st_size
        if size < recorded["bytes"]:
            raise ValueError(
                f"{name}: {str(file)!r} is truncated or altered ({size} bytes, the "
                f"checkpoint needs its first {recorded['bytes']})"
            )
    return manifest


def recorded(checkpoint: pathlib.Path) -> Dict[str, Any]:
    """The manifest of ``checkpoint`` as written (:func:`read_manifest` checks it)."""
    return _read_json(checkpoint / MANIFEST, "the checkpoint manifest")


def locate(
    resume_from: AnyPath,
    experiment: str,
    is_config_of: Callable[[Mapping[str, Any]], Optional[str]],
    name: str = "resume_from",
) -> Located:
    """Finds and checks the checkpoint ``resume_from`` names (see the module).

    Args:
        resume_from: A run directory, a checkpoint directory or its manifest.
        experiment: The experiment resuming.
        is_config_of: Given a run's ``config.json``, ``None`` if it is a config of
            ``experiment``, else what experiment it is of (for the message).
        name: The config key, for messages.

    Raises:
        ValueError: naming ``name`` and the path, if it is missing, not a run or
            checkpoint, of another experiment or format version, or truncated.
    """
    path = pathlib.Path(resume_from)
    shown = f"{name}={str(resume_from)!r}"
    if not path.exists():
        raise ValueError(f"{shown}: no such file or directory")
    if path.is_file():
        if path.name != MANIFEST:
            raise ValueError(
                f"{shown} is a file, not a run directory, a checkpoint directory "
                f"or its {MANIFEST}"
            )
        path = path.parent
    if (path / MANIFEST).is_file():
        manifest = read_manifest(path, experiment, shown)
        return Located(path.parent.parent.parent, path, manifest, manifest["config"])
    if not (path / CONFIG).is_file():
        raise ValueError(
            f"{shown} is neither a run directory (with a {CONFIG}) nor a checkpoint "
            f"directory (with a {MANIFEST})"
        )
    config = _read_json(path / CONFIG, f"{shown}: the run's config")
    other = is_config_of(config)
    if other is not None:
        raise ValueError(f"{shown} is a run of {other}, not of {experiment}")
    checkpoints = complete(root(path))
    if not checkpoints:  # stopped before its first checkpoint: start over
        return Located(path, None, {}, config)
    manifest = read_manifest(checkpoints[-1], experiment, shown)
    return Located(path, checkpoints[-1], manifest, manifest["config"])
