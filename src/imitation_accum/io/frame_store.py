"""The frame store's files: a ``.npy`` file per array and a versioned ``manifest.json``.

The manifest records each array's file, shape, dtype, size and SHA-256, plus
metadata. Nothing is pickled: arrays are memory-mapped with ``allow_pickle=False``
and read only from plain files inside the store's directory. A store is written in
a temporary sibling directory (:mod:`imitation_accum.io.atomic`) renamed into place.
"""

import hashlib
import json
import os
import pathlib
import shutil
from typing import Any, BinaryIO, Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from imitation_accum.io import atomic
from imitation_accum.io.atomic import AnyPath

FORMAT = "imitation_accum.frame_store"
VERSION = 1
MANIFEST = "manifest.json"


class StoreError(ValueError):
    """A store that cannot be read: missing, truncated, corrupt or of a new version."""


def write_store(
    path: AnyPath,
    arrays: Mapping[str, Iterable[np.ndarray]],
    shapes: Mapping[str, Tuple[Tuple[int, ...], np.dtype]],
    metadata: Mapping[str, Any],
) -> Dict[str, Any]:
    """Writes a store to directory ``path``, replacing any store there.

    Args:
        path: The store's directory.
        arrays: Per array name, its rows as consecutive blocks (written in turn,
            never concatenated in memory).
        shapes: Per array name, its full shape and dtype.
        metadata: JSON-serializable metadata kept in the manifest.

    Returns:
        The manifest written.
    """
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = atomic.temporary_sibling(target)
    temporary.mkdir()
    try:
        entries = {}
        for name, blocks in arrays.items():
            shape, dtype = shapes[name]
            with open(temporary / f"{name}.npy", "wb") as file:
                header = {
                    "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                    "fortran_order": False,
                    "shape": tuple(shape),
                }
                np.lib.format.write_array_header_1_0(file, header)
                entries[name] = _entry(name, blocks, shape, dtype, file)
                atomic.fsync_file(file)
        manifest = _manifest(entries, metadata)
        with open(temporary / MANIFEST, "w") as file:
            json.dump(manifest, file, indent=1, sort_keys=True)
            atomic.fsync_file(file)
        atomic.fsync_directory(temporary)
        _replace_directory(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return manifest


def describe(
    arrays: Mapping[str, Iterable[np.ndarray]],
    shapes: Mapping[str, Tuple[Tuple[int, ...], np.dtype]],
    metadata: Mapping[str, Any],
) -> Dict[str, Any]:
    """The manifest :func:`write_store` would write for these arguments (no file)."""
    entries = {
        name: _entry(name, blocks, *shapes[name]) for name, blocks in arrays.items()
    }
    return _manifest(entries, metadata)


def _manifest(entries: Dict[str, Any], metadata: Mapping[str, Any]) -> Dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "arrays": entries,
        "metadata": dict(metadata),
    }


def _entry(
    name: str,
    blocks: Iterable[np.ndarray],
    shape: Tuple[int, ...],
    dtype: np.dtype,
    file: Optional[BinaryIO] = None,
) -> Dict[str, Any]:
    dtype = np.dtype(dtype)
    digest = hashlib.sha256()
    n_bytes = 0
    for block in blocks:
        data = np.ascontiguousarray(block, dtype=dtype).data
        if file is not None:
            file.write(data)
        digest.update(data)
        n_bytes += data.nbytes
    expected = int(np.prod(shape)) * dtype.itemsize
    if file is not None and n_bytes != expected:
        raise ValueError(f"{name}.npy: wrote {n_bytes} bytes, shape needs {expected}")
    return {
        "file": f"{name}.npy",
        "shape": list(shape),
        "dtype": dtype.str,
        "bytes": expected,
        "sha256": digest.hexdigest(),
    }


def _replace_directory(source: pathlib.Path, target: pathlib.Path) -> None:
    # A directory cannot be renamed over a non-empty one: move the old store aside
    # first, then remove it once the new one is in place.
    old = None
    if target.exists():
        if not (target / MANIFEST).is_file() and any(target.iterdir()):
            raise FileExistsError(
                f"{target} exists and is not a frame store; not replacing it"
            )
        old = atomic.temporary_sibling(target, "old.")
        os.replace(target, old)
    os.replace(source, target)
    atomic.fsync_directory(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(path: AnyPath) -> Dict[str, Any]:
    """Reads and checks the manifest of the store at directory ``path``.

    Raises:
        StoreError: naming the file, if the directory or manifest is missing,
            unreadable, of another format or of another version.
    """
    directory = pathlib.Path(path)
    manifest_path = directory / MANIFEST
    if not directory.is_dir():
        raise StoreError(f"{directory}: no such frame-store directory")
    if manifest_path.is_symlink():
        raise StoreError(
            f"{manifest_path}: a symbolic link; the manifest of the frame store "
            f"{directory} must be a plain file inside it"
        )
    if not manifest_path.is_file():
        raise StoreError(f"{manifest_path}: missing; {directory} is not a frame store")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as error:
        raise StoreError(f"{manifest_path}: unreadable ({error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{manifest_path}: not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise StoreError(
            f"{manifest_path}: format version {manifest.get('version')!r}; this "
            f"version of imitation_accum reads version {VERSION}"
        )
    if not isinstance(manifest.get("arrays"), dict):
        raise StoreError(f"{manifest_path}: no 'arrays' table")
    return manifest


def open_array(
    path: AnyPath, manifest: Mapping[str, Any], name: str, verify: bool = False
) -> np.ndarray:
    """Memory-maps array ``name`` of the store at ``path``, read-only, after checks.

    ``manifest`` is the store's (:func:`read_manifest`); ``verify`` also checks the
    SHA-256 (reads the whole file). Returns a read-only ``np.memmap`` (or empty array).

    Raises:
        StoreError: naming the file, if it is missing, truncated, corrupt, of
            another shape or dtype than recorded, not a plain file name inside the
            store or a symbolic link.
    """
    directory = pathlib.Path(path)
    try:
        entry = manifest["arrays"][name]
        file_name = entry["file"]
        shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
    except (KeyError, TypeError, ValueError) as error:
        raise StoreError(
            f"{directory / MANIFEST}: no valid entry for array {name!r}"
        ) from error
    # Checked before anything is opened: a crafted manifest must not make a
    # load read (or map) a file outside the store.
    if not _is_plain_name(file_name):
        raise StoreError(
            f"{directory / MANIFEST}: array {name!r} is stored in {file_name!r}, "
            f"not a plain file name inside the store {directory} (no path "
            "separators, no '..', not absolute)"
        )
    file = directory / file_name
    if file.is_symlink():
        raise StoreError(
            f"{directory / MANIFEST}: array {name!r} is stored in {file_name!r}, "
            f"a symbolic link; the arrays of the store {directory} must be plain "
            "files inside it"
        )
    if not file.is_file():
        raise StoreError(f"{file}: missing")
    try:
        with open(file, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            header = read_header(handle)
            offset = handle.tell()
    except (OSError, ValueError) as error:
        raise StoreError(f"{file}: not a readable .npy file ({error})") from error
    if header[0] != shape or header[2] != dtype or header[1]:
        raise StoreError(
            f"{file}: holds {header[2]} {header[0]}; the manifest records "
            f"{dtype} {shape}"
        )
    size = file.stat().st_size
    if size != offset + int(entry["bytes"]):
        raise StoreError(
            f"{file}: {size - offset} bytes of data, the manifest records "
            f"{entry['bytes']} (truncated or corrupt)"
        )
    if verify and _file_digest(file, offset) != entry["sha256"]:
        raise StoreError(f"{file}: SHA-256 differs from the manifest's (corrupt)")
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dtype)
    return np.load(file, mmap_mode="r", allow_pickle=False)


def _is_plain_name(file_name: Any) -> bool:
    # A name is plain if it is its own last component under either path syntax
    # (this also refuses Windows drive names such as "C:x.npy").
    return (
        isinstance(file_name, str)
        and file_name not in ("", ".", "..")
        and pathlib.PurePosixPath(file_name).name == file_name
        and pathlib.PureWindowsPath(file_name).name == file_name
    )


def _file_digest(file: pathlib.Path, offset: int) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        handle.seek(offset)
        for block in iter(lambda: handle.read(2**24), b""):
            digest.update(block)
    return digest.hexdigest()


#: Metadata that says how a store is used, not what it holds (not fingerprinted).
USAGE_METADATA = ("max_size",)


def fingerprint_of(manifest: Mapping[str, Any]) -> str:
    """A digest of a store's content: its arrays' digests and metadata (less usage)."""
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
