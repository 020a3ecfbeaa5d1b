"""A fragment's ``infos`` as JSON bytes, so that a frame store keeps them unpickled.

imitation's fragments carry the environment's per-step info dicts (episode
statistics, ``TimeLimit.truncated``, SB3's ``terminal_observation``...). They are
kept as one UTF-8 JSON document per fragment: numpy arrays and scalars round-trip
exactly; any other object is kept as its ``repr`` (with a warning), since only a
pickle could keep it as it was.
"""

import json
import warnings
from typing import Any, Optional

import numpy as np

_ARRAY, _REPR = "__ndarray__", "__repr__"


def encode(infos: Optional[Any]) -> bytes:
    """The JSON bytes of a fragment's infos (``None`` or a sequence of dicts)."""
    value = None if infos is None else list(infos)
    return json.dumps(value, default=_encode_value, separators=(",", ":")).encode()


def decode(data: bytes) -> Optional[np.ndarray]:
    """Infos as imitation keeps them: ``None`` or an object array of dicts."""
    value = json.loads(data.decode(), object_hook=_decode_value)
    if value is None:
        return None
    infos = np.empty(len(value), dtype=object)
    infos[:] = value
    return infos


def _encode_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {_ARRAY: value.tolist(), "dtype": value.dtype.str, "shape": value.shape}
    if isinstance(value, np.generic):
        return value.item()
    warnings.warn(
        f"an info value of type {type(value).__name__} is kept as its repr "
        "(a frame store holds JSON, not pickles)",
        RuntimeWarning,
        stacklevel=2,
    )
    return {_REPR: repr(value)}


def _decode_value(value: dict) -> Any:
    if _ARRAY in value:
        array = np.array(value[_ARRAY], dtype=np.dtype(value["dtype"]))
        return array.reshape(value["shape"])
    return value
