"""Atomic writes: a temporary sibling, ``fsync``-ed, renamed over the target.

The one helper for files (:func:`atomic_write`) and one for directories
(:func:`atomic_directory`: checkpoints, frame stores). SIGTERM and SIGINT that
arrive during a write take effect once it is done, so a stopped process leaves no
temporary file behind.
"""

import contextlib
import ctypes
import errno
import functools
import os
import pathlib
import secrets
import shutil
import signal
import sys
import threading
from typing import IO, Any, Callable, Iterator, List, Optional, Tuple, Union

import torch as th

AnyPath = Union[str, os.PathLike]

#: Suffix of the temporary files atomic writes go through.
TEMPORARY_SUFFIX = ".partial"


def fsync_file(file: IO[Any]) -> None:
    """Flushes ``file`` and ``fsync``-s it to disk."""
    file.flush()
    os.fsync(file.fileno())


def fsync_directory(directory: pathlib.Path) -> None:
    """``fsync`` of a directory (makes a rename into it durable), where possible."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_save(obj: Any, path: AnyPath) -> pathlib.Path:
    """``th.save(obj, path)`` (parents created); ``path`` never holds a partial file.

    See :func:`atomic_write`.
    """
    return atomic_write(path, lambda file: th.save(obj, file))


def atomic_write(path: AnyPath, write: Callable[[IO[bytes]], Any]) -> pathlib.Path:
    """``write(file)`` into ``path`` (parents created); never a partial file there.

    If anything fails, the temporary file is removed and ``path`` is left as it was.

    Returns:
        ``path`` as a ``pathlib.Path``.

    Raises:
        AtomicWriteError: if writing failed (a full disk, a file size limit):
            naming ``path`` and saying that its earlier content is intact.
    """
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with stop_signals_deferred():
        fd, temporary = _make_temporary(target)
        try:
            try:
                with os.fdopen(fd, "wb") as file:
                    write(file)
                    fsync_file(file)
            except (OSError, RuntimeError) as error:
                # torch reports a short write as "RuntimeError: [enforce fail at
                # inline_container.cc] unexpected pos", which names no file or cause.
                if isinstance(error, RuntimeError) and not _is_write_error(error):
                    raise
                raise AtomicWriteError(_write_failure(target, error)) from error
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
    fsync_directory(target.parent)
    return target


@contextlib.contextmanager
def atomic_directory(path: AnyPath, *, replace: bool = False) -> Iterator[pathlib.Path]:
    """A directory ``path`` that appears complete or not at all.

    The block writes into the temporary sibling it is given; when it ends, every
    file there is ``fsync``-ed and the directory renamed to ``path``. With
    ``replace``, an existing ``path`` is swapped out in one step (Linux
    ``renameat2(RENAME_EXCHANGE)``): at every moment it holds the whole old
    directory or the whole new one. Where the swap is not offered, the old one is
    moved aside, and back if the new one cannot move in. If the block raises, the
    temporary is removed; a killed process leaves only temporary siblings, which
    :func:`remove_stale_temporaries` removes.

    Args:
        path: The directory to write.
        replace: Replace an existing ``path``; otherwise it must not exist.

    Yields:
        The temporary directory to write into.

    Raises:
        FileExistsError: if ``path`` exists and ``replace`` is false (checked
            before anything is written).
        ReplaceError: if the new directory could not be moved in nor the old one
            back; the message says where both are.
    """
    target = pathlib.Path(path)
    if os.path.lexists(target) and not replace:
        raise FileExistsError(f"{str(target)!r} exists; not replacing it")
    target.parent.mkdir(parents=True, exist_ok=True)
    with stop_signals_deferred():
        temporary = temporary_sibling(target)
        temporary.mkdir()
        try:
            yield temporary
            for folder, _, files in os.walk(temporary):
                for name in files:
                    with open(os.path.join(folder, name), "rb") as file:
                        os.fsync(file.fileno())
                fsync_directory(pathlib.Path(folder))
            _move_in(temporary, target)
        except ReplaceError:
            raise  # both directories are kept where the message says
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    fsync_directory(target.parent)


class ReplaceError(OSError):
    """A new directory could not be moved in, nor the old one back: both kept."""


def _move_in(source: pathlib.Path, target: pathlib.Path) -> None:
    # Moves the complete directory `source` to `target`, replacing what is there.
    if not os.path.lexists(target):
        os.rename(source, target)
        return
    if _exchange(source, target):  # source now holds the old directory
        shutil.rmtree(source, ignore_errors=True)
        return
    # A directory cannot be renamed over a non-empty one.
    old = temporary_sibling(target, "old.")
    os.replace(target, old)
    try:
        os.replace(source, target)
    except BaseException as error:
        try:
            os.replace(old, target)
        except BaseException as restore_error:
            raise ReplaceError(
                f"{target}: the new directory could not be moved in ({error}), nor "
                f"the old one back ({restore_error}): the old one is at {old}, the "
                f"new one at {source}"
            ) from error
        raise OSError(
            f"{target}: the new directory could not be moved in ({error}); {target} "
            f"still holds the old one; the new one (at {source}) is removed"
        ) from error
    shutil.rmtree(old, ignore_errors=True)


def _exchange(source: pathlib.Path, target: pathlib.Path) -> bool:
    """Swaps two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns:
        ``False``, having changed nothing, where the system or file system does
        not offer the swap.

    Raises:
        OSError: if the swap fails otherwise (nothing is changed then either).
    """
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2  # from <fcntl.h> and <linux/fs.h>
    if renameat2(
        at_fdcwd, os.fsencode(source), at_fdcwd, os.fsencode(target), rename_exchange
    ):
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
            return False
        raise OSError(code, os.strerror(code), str(source), None, str(target))
    return True


@functools.cache
def _renameat2() -> Optional[Any]:
    # Python has no os.renameat2; glibc 2.28+ has it.
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    int_, path = ctypes.c_int, ctypes.c_char_p
    function.argtypes = [int_, path, int_, path, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


class AtomicWriteError(OSError):
    """Writing a file atomically failed; the target is as it was before."""


#: Errors of a write that ran out of room (disk, quota, file size limit).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _write_failure(target: pathlib.Path, error: BaseException) -> str:
    # What failed, why if known, and that the earlier file is untouched.
    cause = f"{type(error).__name__}: {error}"
    if getattr(error, "errno", None) in _NO_ROOM or _disk_full(target.parent):
        reason = "the disk is full (or a file size limit or quota was reached)"
    else:
        reason = "the write failed; is the disk full?"
    kept = (
        f"the previous {target.name} is intact"
        if target.exists()
        else "no partial file was left"
    )
    return f"could not write {str(target)!r}: {reason} ({cause}); {kept}"


def _is_write_error(error: RuntimeError) -> bool:
    # torch's zip writer (PyTorchStreamWriter, inline_container.cc) failing a write.
    return any(tag in str(error) for tag in ("inline_container", "PytorchStreamWriter"))


def _disk_full(directory: pathlib.Path) -> bool:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return False
    return stats.f_bavail == 0


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT received inside the block take effect when it ends.

    Python runs signal handlers between bytecodes, so a handler that exits (as
    the scripts' SIGTERM handler does) could otherwise run between creating a
    temporary file and the ``try`` that removes it. Handlers can only be changed
    in the main thread; elsewhere nothing is deferred.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: List[int] = []
    previous = {
        signum: signal.signal(signum, lambda number, frame: received.append(number))
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for number in dict.fromkeys(received):
            signal.raise_signal(number)


def temporary_sibling(target: pathlib.Path, tag: str = "") -> pathlib.Path:
    """A fresh temporary path next to ``target``, ``tag`` before its random part.

    Nothing is created; :func:`remove_stale_temporaries` removes what is.
    """
    token = secrets.token_hex(6)
    return target.parent / f".{target.name}.{tag}{token}{TEMPORARY_SUFFIX}"


def _make_temporary(target: pathlib.Path) -> Tuple[int, str]:
    # Like tempfile.mkstemp, but with the permissions th.save would give (the
    # umask applies) rather than owner-only ones.
    while True:
        path = temporary_sibling(target)
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(path)
        except FileExistsError:
            continue


def remove_stale_temporaries(path: AnyPath) -> List[pathlib.Path]:
    """Deletes (and returns) temporaries of killed atomic writes to ``path``.

    Files of :func:`atomic_write`, directories of :func:`atomic_directory`.
    """
    target = pathlib.Path(path)
    if not target.parent.is_dir():
        return []
    removed = []
    for stale in target.parent.glob(f".{target.name}.*{TEMPORARY_SUFFIX}"):
        if stale.is_dir() and not stale.is_symlink():  # of atomic_directory
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale)
            continue
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            removed.append(stale)
    return removed
