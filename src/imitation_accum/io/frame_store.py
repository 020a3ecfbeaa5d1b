"""The frame store's files: a ``.npy`` file per array and a versioned ``manifest.json``.

The manifest records each array's file, shape, dtype, size and SHA-256, plus
metadata. Nothing is pickled: arrays are memory-mapped with ``allow_pickle=False``
from plain files inside the store's directory. A store is written whole in a
temporary directory swapped into place (:func:`write_store`), or grown in place,
each append writing only its new rows (:class:`Appender`); both write the same
files, whose fixed-size headers let the data stay put as rows are added.
"""

import errno
import hashlib
import json
import math
import os
import pathlib
import shutil
import stat
from typing import Any, BinaryIO, Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from imitation_accum.io import atomic
from imitation_accum.io.atomic import AnyPath

FORMAT = "imitation_accum.frame_store"
VERSION = 1
MANIFEST = "manifest.json"


class StoreError(ValueError):
    """A store that cannot be read: missing, truncated, corrupt or of a new version."""


#: An array's full shape and dtype.
ArrayType = Tuple[Tuple[int, ...], np.dtype]


def write_store(
    path: AnyPath,
    arrays: Mapping[str, Iterable[np.ndarray]],
    shapes: Mapping[str, ArrayType],
    metadata: Mapping[str, Any],
    env_id: Optional[str] = None,
) -> Dict[str, Any]:
    """Writes a store to directory ``path``, replacing any store there, atomically.

    Args:
        path: The store's directory.
        arrays: Per array name, its rows as consecutive blocks (never concatenated).
        shapes: Per array name, its full shape and dtype.
        metadata: JSON-serializable metadata kept in the manifest.
        env_id: The environment id kept as the manifest's ``"env_id"`` (if any).

    Returns:
        The manifest written.

    Raises:
        FileExistsError: if ``path`` exists and is not a frame store (checked
            before anything is written).
        OSError: as :func:`imitation_accum.io.atomic.atomic_directory`.
    """
    target = pathlib.Path(path)
    if os.path.lexists(target) and (
        not target.is_dir()
        or (not (target / MANIFEST).is_file() and any(target.iterdir()))
    ):
        raise FileExistsError(
            f"{target} exists and is not a frame store; not replacing it"
        )
    with atomic.atomic_directory(target, replace=True) as temporary:
        return Appender(temporary, None, {}).append(arrays, shapes, metadata, env_id)


def describe(
    arrays: Mapping[str, Iterable[np.ndarray]],
    shapes: Mapping[str, ArrayType],
    metadata: Mapping[str, Any],
) -> Dict[str, Any]:
    """The manifest :func:`write_store` would write for these arguments (no file)."""
    entries = {}
    for name, blocks in arrays.items():
        shape, dtype = shapes[name]
        digest = hashlib.sha256()
        n_bytes = _write_blocks(blocks, np.dtype(dtype), digest)
        entries[name] = _entry(name, shape, dtype, n_bytes, digest)
    return _manifest(entries, metadata)


def _manifest(
    entries: Dict[str, Any], metadata: Mapping[str, Any], env_id: Optional[str] = None
) -> Dict[str, Any]:
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "arrays": entries,
        "metadata": dict(metadata),
    }
    if env_id is not None:
        manifest["env_id"] = env_id
    return manifest


def _entry(
    name: str, shape: Tuple[int, ...], dtype: np.dtype, n_bytes: int, digest: Any
) -> Dict[str, Any]:
    return {
        "file": f"{name}.npy",
        "shape": [int(n) for n in shape],
        "dtype": np.dtype(dtype).str,
        "bytes": n_bytes,
        "sha256": digest.hexdigest(),
    }


def _write_blocks(
    blocks: Iterable[np.ndarray],
    dtype: np.dtype,
    digest: Any,
    file: Optional[BinaryIO] = None,
) -> int:
    """Writes ``blocks`` as ``dtype`` to ``file`` (if any), hashing them; bytes."""
    n_bytes = 0
    for block in blocks:
        data = np.ascontiguousarray(block, dtype=dtype).data
        if file is not None:
            file.write(data)
        digest.update(data)
        n_bytes += data.nbytes
    return n_bytes


def read_manifest(path: AnyPath) -> Dict[str, Any]:
    """Reads and checks the manifest of the store at directory ``path``.

    Raises:
        StoreError: naming the file, if the directory or manifest is missing,
            unreadable, a symbolic link, of another format or of another version.
    """
    directory = pathlib.Path(path)
    manifest_path = directory / MANIFEST
    if not directory.is_dir():
        raise StoreError(f"{directory}: no such frame-store directory")
    try:
        with _open_plain(directory, MANIFEST, "the manifest") as file:
            manifest = json.loads(file.read())
    except (OSError, ValueError) as error:
        if isinstance(error, StoreError):
            raise
        raise StoreError(f"{manifest_path}: unreadable ({error})") from error
    return check_manifest(manifest, str(manifest_path))


def check_manifest(manifest: Any, where: str) -> Dict[str, Any]:
    """Checks that ``manifest`` is a store manifest of this version; returns it.

    Args:
        manifest: A manifest as read from JSON.
        where: Where it was read from, for messages (a file, or a file and key).

    Raises:
        StoreError: naming ``where``, if it is of another format or version, or
            lacks its tables.
    """
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{where}: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise StoreError(
            f"{where}: format version {manifest.get('version')!r}; this "
            f"version of imitation_accum reads version {VERSION}"
        )
    if not isinstance(manifest.get("arrays"), dict):
        raise StoreError(f"{where}: no 'arrays' table")
    if not isinstance(manifest.get("metadata", {}), dict):
        raise StoreError(f"{where}: 'metadata' is not a table")
    env_id = manifest.get("env_id")
    if env_id is not None and not isinstance(env_id, str):
        raise StoreError(f"{where}: 'env_id' is {env_id!r}, not a string")
    return manifest


def open_array(
    path: AnyPath, manifest: Mapping[str, Any], name: str, verify: bool = False
) -> np.ndarray:
    """Memory-maps array ``name`` of the store at ``path``, read-only, after checks.

    ``manifest`` is the store's (:func:`read_manifest`); ``verify`` also checks the
    SHA-256 (reads the whole file). The file is opened once, without following a
    symbolic link, and mapped from that descriptor: what was checked is mapped.

    Raises:
        StoreError: naming the file, if the entry is incomplete, the file missing,
            truncated, corrupt, of another shape or dtype than recorded, not a
            plain file inside the store, a symbolic link or not a regular file.
    """
    return _open_checked(pathlib.Path(path), manifest, name, verify, None)[0]


def _open_checked(
    directory: pathlib.Path,
    manifest: Mapping[str, Any],
    name: str,
    verify: bool,
    source: Optional[str],
) -> Tuple[np.ndarray, Any]:
    """Array ``name``, checked, and the SHA-256 state of its data (if ``verify``).

    ``source`` ``None``: a saved store, whose file holds its header and exactly the
    recorded bytes. Else the committed rows of a grown store, as the manifest read
    from ``source`` records them: the header is not read (an uncommitted append may
    have rewritten it), the data start at :func:`append_header_bytes` and the file
    may hold more.
    """
    file_name, shape, dtype, n_bytes, sha256 = _check_entry(
        directory, manifest, name, source
    )
    file_path = directory / file_name
    recorder = source or "the manifest"
    with _open_plain(directory, file_name, f"array {name!r}") as file:
        if source is None:
            offset = _read_header(file, file_path, shape, dtype)
        else:
            offset = append_header_bytes(shape[1:], dtype)
        size = os.fstat(file.fileno()).st_size - offset
        if size < n_bytes or (source is None and size != n_bytes):
            raise StoreError(
                f"{file_path}: {max(size, 0)} bytes of data, {recorder} records "
                f"{n_bytes} ({'truncated' if size < n_bytes else 'corrupt'})"
            )
        digest = None
        if verify:
            digest = hashlib.sha256()
            file.seek(offset)
            left = n_bytes
            while left:
                block = file.read(min(left, 2**24))
                if not block:
                    raise StoreError(f"{file_path}: shorter than it was when opened")
                digest.update(block)
                left -= len(block)
            if digest.hexdigest() != sha256:
                raise StoreError(
                    f"{file_path}: the SHA-256 of its first {n_bytes} bytes of data "
                    f"differs from the one {recorder} records (corrupt)"
                )
        if n_bytes == 0:
            return np.empty(shape, dtype), digest
        # The map holds its own reference to the file; closing ours is safe.
        mapped = np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=shape)
        return mapped, digest


def _read_header(
    file: BinaryIO, file_path: pathlib.Path, shape: Tuple[int, ...], dtype: np.dtype
) -> int:
    """Checks a ``.npy`` header against the manifest's entry; where the data start."""
    try:
        version = np.lib.format.read_magic(file)
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        header = read_header(file)
    except (OSError, ValueError) as error:
        raise StoreError(f"{file_path}: not a readable .npy file ({error})") from error
    if header[0] != shape or header[2] != dtype or header[1]:
        raise StoreError(
            f"{file_path}: holds {header[2]} {header[0]}; the manifest records "
            f"{dtype} {shape}"
        )
    return file.tell()


def _check_entry(
    directory: pathlib.Path,
    manifest: Mapping[str, Any],
    name: str,
    source: Optional[str] = None,
) -> Tuple[str, Tuple[int, ...], np.dtype, int, str]:
    """Array ``name``'s manifest entry: file name, shape, dtype, bytes, SHA-256.

    Everything is checked before a file is opened: a crafted manifest must not
    make a load read (or map) a file outside the store, or map more than the file.
    ``source`` names the manifest in messages (default: the store's own).
    """
    where = f"{source or directory / MANIFEST}: array {name!r}"
    entry = manifest["arrays"].get(name)
    if not isinstance(entry, dict):
        raise StoreError(f"{where}: no entry")
    missing = [
        k for k in ("file", "shape", "dtype", "bytes", "sha256") if k not in entry
    ]
    if missing:
        raise StoreError(f"{where}: the entry has no {', '.join(map(repr, missing))}")
    file_name, shape, n_bytes, sha256 = (
        entry["file"],
        entry["shape"],
        entry["bytes"],
        entry["sha256"],
    )
    if not _is_plain_name(file_name):
        raise StoreError(
            f"{where} is stored in {file_name!r}, not a plain file name inside the "
            f"store {directory} (no path separators, no '..', not absolute)"
        )
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise StoreError(f"{where}: shape {shape!r} is not a list of sizes >= 0")
    try:
        dtype = np.dtype(entry["dtype"])
    except (TypeError, ValueError) as error:
        raise StoreError(f"{where}: dtype {entry['dtype']!r} ({error})") from error
    if dtype.hasobject or not isinstance(entry["dtype"], str):
        raise StoreError(f"{where}: dtype {entry['dtype']!r} is not a plain dtype")
    if not _is_count(n_bytes):
        raise StoreError(f"{where}: bytes {n_bytes!r} is not a size")
    # Python integers: a shape whose product overflows int64 is caught here.
    needed = math.prod(shape) * dtype.itemsize
    if needed != n_bytes:
        raise StoreError(
            f"{where}: shape {shape} of {dtype} needs {needed} bytes, the entry "
            f"records {n_bytes}"
        )
    if needed > np.iinfo(np.int64).max:
        raise StoreError(f"{where}: shape {shape} is too large")
    if not isinstance(sha256, str) or len(sha256) != 64:
        raise StoreError(f"{where}: sha256 {sha256!r} is not a SHA-256 digest")
    return file_name, tuple(shape), dtype, n_bytes, sha256


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _open_plain(
    directory: pathlib.Path, file_name: str, what: str, write: bool = False
) -> BinaryIO:
    """Opens ``directory / file_name``: a regular file, not a link.

    To read, or with ``write`` to read and write (created if missing).
    ``O_NOFOLLOW`` refuses a link in the open itself (no check-then-open race);
    ``O_NONBLOCK`` keeps a FIFO from blocking before ``fstat`` refuses it.

    Raises:
        StoreError: naming the file and the store.
    """
    path = directory / file_name
    flags = (os.O_RDWR | os.O_CREAT) if write else os.O_RDONLY
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    if path.is_symlink():  # where O_NOFOLLOW is missing, and for a clear message
        raise StoreError(
            f"{path}: {what} of the frame store {directory} is a symbolic link; "
            "it must be a plain file inside the store"
        )
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o666)
    except FileNotFoundError as error:
        raise StoreError(f"{path}: missing ({what} of {directory})") from error
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise StoreError(
                f"{path}: {what} of the frame store {directory} is a symbolic "
                "link; it must be a plain file inside the store"
            ) from error
        raise StoreError(f"{path}: cannot be opened ({error})") from error
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError(f"{path}: {what} of {directory} is not a regular file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "r+b" if write else "rb")


def _is_plain_name(file_name: Any) -> bool:
    # A name is plain if it is its own last component under either path syntax
    # (this also refuses Windows drive names such as "C:x.npy").
    return (
        isinstance(file_name, str)
        and file_name not in ("", ".", "..")
        and pathlib.PurePosixPath(file_name).name == file_name
        and pathlib.PureWindowsPath(file_name).name == file_name
    )


#: Metadata that says how a store is used, not what it holds (not fingerprinted).
USAGE_METADATA = ("max_size",)


def fingerprint_of(manifest: Mapping[str, Any]) -> str:
    """The fingerprint of preference data: a digest of a store's manifest.

    Its arrays' shapes, dtypes and digests and its metadata, less
    :data:`USAGE_METADATA` (and the ``env_id``, provenance). The package's one
    fingerprint (:meth:`~imitation_accum.PreferenceDataset.fingerprint`).
    """
    metadata = {
        key: value
        for key, value in manifest.get("metadata", {}).items()
        if key not in USAGE_METADATA
    }
    content = {
        "arrays": {
            name: [entry["shape"], entry["dtype"], entry["sha256"]]
            for name, entry in sorted(manifest["arrays"].items())
        },
        "metadata": metadata,
    }
    encoded = json.dumps(content, sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()


# -- a store grown in place ----------------------------------------------------


def append_header_bytes(row_shape: Tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of the ``.npy`` header of an array file an :class:`Appender` grows.

    The header of ``2**63 - 1`` rows of ``row_shape``, rounded up to 64 bytes: any
    row count fits, so an append rewrites the header in place and the data never
    move.
    """
    longest = _npy_header_text((2**63 - 1, *row_shape), dtype)
    return -(-(10 + len(longest) + 1) // 64) * 64


def _npy_header_text(shape: Tuple[int, ...], dtype: np.dtype) -> str:
    # As numpy writes it (keys sorted), without the padding.
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    shape = tuple(shape)
    return f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"


def _npy_header(shape: Tuple[int, ...], dtype: np.dtype) -> bytes:
    """A version 1.0 ``.npy`` header of :func:`append_header_bytes` bytes."""
    size = append_header_bytes(shape[1:], dtype)
    text = _npy_header_text(shape, dtype).ljust(size - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + (size - 10).to_bytes(2, "little") + text.encode()


class Appender:
    """Grows a frame store in place: each append writes only the rows added since.

    What counts is the *committed* manifest, which the caller records where it
    commits (a checkpoint): :meth:`append` cuts each file back to it (dropping an
    append cut short or never committed), writes and ``fsync``-s the new rows and
    returns the new manifest; :meth:`commit` makes that the committed one. Each
    append hashes only its new rows, from the kept hash state of the committed
    data. A new store comes from :meth:`create`; a committed one from
    :func:`open_committed`.

    Args:
        path: The store's directory.
        manifest: Its committed manifest; ``None``: an empty store.
        hashes: Per array, the SHA-256 state of its committed data.
    """

    def __init__(
        self,
        path: AnyPath,
        manifest: Optional[Dict[str, Any]],
        hashes: Mapping[str, Any],
    ) -> None:
        self.path = pathlib.Path(path)
        self._committed = (manifest, dict(hashes))
        self._pending: Optional[Tuple[Dict[str, Any], Dict[str, Any]]] = None

    @classmethod
    def create(cls, path: AnyPath) -> "Appender":
        """A new, empty store at directory ``path``, replacing whatever is there."""
        directory = pathlib.Path(path)
        if directory.is_dir() and not directory.is_symlink():
            shutil.rmtree(directory)
        elif os.path.lexists(directory):
            directory.unlink()
        directory.mkdir(parents=True)
        atomic.fsync_directory(directory.parent)
        return cls(directory, None, {})

    @property
    def manifest(self) -> Optional[Dict[str, Any]]:
        """The committed manifest (``None`` while nothing is committed)."""
        return self._committed[0]

    def rows(self, name: str) -> int:
        """Rows of array ``name`` that are committed."""
        manifest = self.manifest
        if manifest is None or name not in manifest["arrays"]:
            return 0
        return int(manifest["arrays"][name]["shape"][0])

    def append(
        self,
        arrays: Mapping[str, Iterable[np.ndarray]],
        shapes: Mapping[str, ArrayType],
        metadata: Mapping[str, Any],
        env_id: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Appends rows to every array, after its committed rows; returns the manifest.

        The manifest (also written as ``manifest.json``) holds until :meth:`commit`;
        another append before then replaces these rows.

        Args:
            arrays: Per array name, the new rows as consecutive blocks.
            shapes: Per array name, its full shape (all rows) and dtype.
            metadata: JSON-serializable metadata kept in the manifest.
            env_id: The environment id kept in the manifest (if any).

        Raises:
            ValueError: if the arrays, a row shape or dtype differ from the committed
                ones, or the blocks do not fill the shape.
        """
        manifest, hashes = self._committed
        committed = {} if manifest is None else manifest["arrays"]
        if committed and set(committed) != set(arrays):
            raise ValueError(
                f"{self.path}: appending arrays {sorted(arrays)} to a store of "
                f"{sorted(committed)}"
            )
        entries, new_hashes = {}, {}
        for name, blocks in arrays.items():
            shape, dtype = shapes[name]
            shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
            file_path = self.path / f"{name}.npy"
            old = committed.get(name)
            if old is not None and (
                tuple(old["shape"][1:]) != shape[1:] or np.dtype(old["dtype"]) != dtype
            ):
                raise ValueError(
                    f"{file_path}: rows of {dtype} {shape[1:]} cannot be appended to "
                    f"rows of {np.dtype(old['dtype'])} {tuple(old['shape'][1:])}"
                )
            old_bytes = 0 if old is None else old["bytes"]
            digest = hashlib.sha256() if old is None else hashes[name].copy()
            header = _npy_header(shape, dtype)
            with _open_plain(self.path, file_path.name, "array", write=True) as file:
                file.truncate(len(header) + old_bytes)  # what no commit holds goes
                file.seek(len(header) + old_bytes)
                n_bytes = old_bytes + _write_blocks(blocks, dtype, digest, file)
                expected = math.prod(shape) * dtype.itemsize
                if n_bytes != expected:
                    raise ValueError(
                        f"{file_path}: holds {n_bytes} bytes, shape needs {expected}"
                    )
                file.seek(0)
                file.write(header)
                atomic.fsync_file(file)
            entries[name] = _entry(name, shape, dtype, n_bytes, digest)
            new_hashes[name] = digest
        new_manifest = _manifest(entries, metadata, env_id)
        text = json.dumps(new_manifest, indent=1, sort_keys=True).encode()
        atomic.atomic_write(self.path / MANIFEST, lambda file: file.write(text))
        self._pending = (new_manifest, new_hashes)
        return new_manifest

    def commit(self) -> None:
        """Makes the manifest of the last :meth:`append` the committed one."""
        if self._pending is None:
            raise ValueError(f"{self.path}: nothing appended since the last commit")
        self._committed, self._pending = self._pending, None


def committed_bytes(manifest: Mapping[str, Any]) -> Dict[str, int]:
    """Per file of a grown store, the bytes its manifest ``manifest`` commits.

    The header and the committed data: the file may be longer, never shorter.
    """
    return {
        entry["file"]: append_header_bytes(
            tuple(entry["shape"][1:]), np.dtype(entry["dtype"])
        )
        + entry["bytes"]
        for entry in manifest["arrays"].values()
    }


def open_committed(
    path: AnyPath, manifest: Any, source: str, names: Iterable[str]
) -> Tuple[Dict[str, np.ndarray], Appender]:
    """Maps a grown store's arrays as a committed manifest records them.

    Every committed byte is hashed and checked; bytes after them (an append cut
    short or never committed) are not read, and the returned appender's next
    append cuts them off. Nothing is written.

    Args:
        path: The store's directory.
        manifest: The committed manifest (as :meth:`Appender.append` returned it).
        source: Where ``manifest`` was read from, for messages.
        names: The arrays to open.

    Returns:
        Per array, a read-only map of its committed rows; an :class:`Appender`.

    Raises:
        StoreError: naming the file or ``source``, as :func:`open_array`.
    """
    directory = pathlib.Path(path)
    check_manifest(manifest, source)
    arrays, hashes = {}, {}
    for name in names:
        arrays[name], hashes[name] = _open_checked(
            directory, manifest, name, True, source
        )
    return arrays, Appender(directory, manifest, hashes)
