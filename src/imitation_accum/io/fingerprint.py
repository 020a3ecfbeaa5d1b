"""A cheap fingerprint of a preference dataset's contents.

Checked before training, that every rank of a distributed run loaded the same
data, and on resume, that a checkpoint was trained on this data.
"""

import hashlib
from typing import Any

import numpy as np

#: Pairs whose frames are hashed (spread evenly from the first to the last).
SAMPLED_PAIRS = 8


def _hash_array(digest: "hashlib._Hash", value: Any) -> None:
    array = np.ascontiguousarray(np.asarray(value))
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())


def dataset_fingerprint(dataset: Any, sampled_pairs: int = SAMPLED_PAIRS) -> str:
    """A fingerprint of ``dataset``'s contents, without reading every frame.

    It hashes all preferences, every fragment's length (when the dataset holds its
    fragments in lists, as imitation's ``PreferenceDataset`` does), and the
    observations and actions of a few pairs spread evenly over the dataset. A
    dataset with a ``fingerprint()`` method (a frame store reads it from its
    manifest) is trusted to give it.

    Args:
        dataset: A preference dataset: ``__len__`` and ``__getitem__`` returning
            ``((fragment1, fragment2), preference)``, or anything with a
            ``fingerprint()`` method.
        sampled_pairs: How many pairs' observations and actions are hashed.

    Returns:
        ``dataset.fingerprint()`` if it has one; otherwise ``"sha256:"`` and a
        hex digest.
    """
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        return str(own())
    digest = hashlib.sha256()
    n_pairs = len(dataset)
    digest.update(f"pairs={n_pairs};".encode())
    preferences = getattr(dataset, "preferences", None)
    if preferences is None:
        preferences = [dataset[i][1] for i in range(n_pairs)]
    _hash_array(digest, np.asarray(preferences, dtype=np.float64))
    for name in ("fragments1", "fragments2"):
        fragments = getattr(dataset, name, None)
        if fragments is not None:
            _hash_array(digest, [len(f.acts) for f in fragments])
    if n_pairs:
        positions = np.unique(
            np.linspace(0, n_pairs - 1, min(n_pairs, sampled_pairs)).astype(int)
        )
        for position in positions:
            pair, _ = dataset[int(position)]
            for fragment in pair:
                _hash_array(digest, fragment.obs)
                _hash_array(digest, fragment.acts)
    return f"sha256:{digest.hexdigest()}"
