"""Which items form each batch: a fresh permutation per epoch.

Permutations are drawn from the trainer's own ``numpy`` generator.

Batch composition and order never depend on ``minibatch_size`` (the split into
minibatches happens inside a batch), and never on torch's global RNG. Epochs run
``B1 B2 B3 B1' B2' B3'``: every epoch reshuffles.
"""

from typing import List

import numpy as np


def epoch_batches(
    rng: np.random.Generator,
    indices: np.ndarray,
    batch_size: int,
    drop_last: bool = False,
) -> List[np.ndarray]:
    """One epoch's batches over ``indices``, freshly shuffled.

    Args:
        rng: Source of the permutation.
        indices: Dataset indices to draw from.
        batch_size: Items per batch.
        drop_last: Whether to drop the last batch if it is partial.

    Returns:
        Index arrays, one per batch.
    """
    order = rng.permutation(indices)
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def n_batches(n_items: int, batch_size: int, drop_last: bool) -> int:
    """Batches per epoch over ``n_items``.

    Raises:
        ValueError: if ``drop_last`` leaves no batch.
    """
    steps = n_items // batch_size
    if not drop_last and n_items % batch_size:
        steps += 1
    if steps == 0:
        raise ValueError(
            f"drop_last=True with {n_items} training comparisons and "
            f"batch_size={batch_size}: no batch to train on",
        )
    return steps


def split_validation(
    rng: np.random.Generator,
    n_items: int,
    val_fraction: float,
) -> "tuple[np.ndarray, np.ndarray]":
    """Splits ``range(n_items)`` into training and validation indices.

    The validation share is ``int(n_items * val_fraction)``, as in imitation.

    Args:
        rng: Source of the split.
        n_items: Items in the dataset.
        val_fraction: Fraction held out for validation.

    Returns:
        ``(train_indices, val_indices)``.

    Raises:
        ValueError: if either part would be empty.
    """
    n_val = int(n_items * val_fraction)
    if n_val < 1 or n_items - n_val < 1:
        # imitation's message first: code that matches on it keeps working.
        raise ValueError(
            "Not enough data samples to split into training and validation: "
            f"cannot split {n_items} comparisons with val_split={val_fraction}: "
            "both the training and the validation part need at least one "
            "comparison. Gather more preferences (initial_comparison_frac in "
            "PreferenceComparisons) or change the regularizer's val_split.",
        )
    order = rng.permutation(n_items)
    return np.sort(order[n_val:]), np.sort(order[:n_val])
