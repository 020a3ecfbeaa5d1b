"""A trained reward net's accuracy on fresh fragment pairs, labelled by the true reward.

The training accuracy that imitation logs is measured on the pairs the net was just
fitted to, labelled as the gatherer labelled them (ties and sampled labels
included). :func:`evaluate` asks a cleaner question: on new pairs whose fragments
differ in true return, how often does the net prefer the better one? Chance is 0.5.
"""

import math
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.data import rollout
from imitation.data import types as imit_types
from imitation.util import networks

#: The keys :func:`evaluate` returns (they go into the run's result).
ACCURACY = "held_out_accuracy"
NON_TIED = "held_out_non_tied_pairs"

#: What the accuracy means, in one line (printed with it).
MEANING = (
    "share of fresh fragment pairs (never trained on; ties by the environment's "
    "reward dropped) whose better fragment the reward net scores higher; chance 0.5"
)


def true_returns(
    pairs: Sequence[imit_types.TrajectoryWithRewPair], discount_factor: float
) -> np.ndarray:
    """The discounted environment returns of each pair's fragments, shape ``(N, 2)``.

    Args:
        pairs: Fragment pairs with the environment's rewards.
        discount_factor: Discount of a fragment's return, from its first step.

    Returns:
        Row ``i`` holds the returns of pair ``i``'s first and second fragment.
    """
    return np.array(
        [
            [rollout.discounted_sum(frag.rews, discount_factor) for frag in pair]
            for pair in pairs
        ],
        dtype=np.float64,
    ).reshape(len(pairs), 2)


def accuracy(
    preference_model: pc.PreferenceModel,
    pairs: Sequence[imit_types.TrajectoryWithRewPair],
) -> Dict[str, Optional[float]]:
    """The net's accuracy on the non-tied ``pairs``, and how many there are.

    A pair counts as right when the preference model gives its better fragment
    (by the environment's return, discounted as the model discounts) a probability
    above 0.5; an even 0.5 counts as wrong. The net runs in eval mode, without
    gradients, so its norm layers' statistics do not move.

    Args:
        preference_model: The preference model of the trained reward net (for an
            ensemble, the members' mean probability is used).
        pairs: Fragment pairs with the environment's rewards.

    Returns:
        ``{ACCURACY: accuracy or None (no non-tied pair), NON_TIED: count}``.
    """
    returns = true_returns(pairs, preference_model.discount_factor)
    better_first = np.sign(returns[:, 0] - returns[:, 1])
    kept = np.flatnonzero(better_first != 0)
    if len(kept) == 0:
        return {ACCURACY: None, NON_TIED: 0}
    with networks.evaluating(preference_model.model), th.no_grad():
        probs, _ = preference_model([pairs[int(i)] for i in kept])
    probs_np = probs.detach().cpu().numpy().reshape(len(kept), -1).mean(axis=1)
    predicted = np.sign(probs_np - 0.5)
    return {
        ACCURACY: float(np.mean(predicted == better_first[kept])),
        NON_TIED: len(kept),
    }


def evaluate(
    trajectory_generator: pc.TrajectoryGenerator,
    preference_model: pc.PreferenceModel,
    *,
    num_pairs: int,
    fragment_length: int,
    rng: np.random.Generator,
    transition_oversampling: float = 1.0,
    logger: Optional[Any] = None,
) -> Dict[str, Optional[float]]:
    """Samples ``num_pairs`` fresh fragment pairs and scores the net on them.

    The trajectories come from ``trajectory_generator.sample`` (after training:
    the final agent's rollouts, with the environment's rewards), the pairs from
    imitation's ``RandomFragmenter``, as in training; nothing is trained on them.

    Args:
        trajectory_generator: What training sampled trajectories from. A
            ``TrajectoryDataset`` samples the trajectories it trained on: the pairs
            are new, their frames may not be.
        preference_model: The preference model of the trained reward net.
        num_pairs: Pairs to sample (ties among them are then dropped).
        fragment_length: Transitions per fragment.
        rng: Draws the fragments.
        transition_oversampling: As in ``PreferenceComparisons``.
        logger: imitation's logger, told what is collected and the result.

    Returns:
        ``{ACCURACY: accuracy or None (no non-tied pair), NON_TIED: count}``.
    """
    steps = math.ceil(transition_oversampling * 2 * num_pairs * fragment_length)
    if logger is not None:
        logger.log(f"Collecting {num_pairs} held-out pairs ({steps} transitions)")
    trajectories = trajectory_generator.sample(steps)
    fragmenter = pc.RandomFragmenter(rng=rng)
    pairs = fragmenter(trajectories, fragment_length, num_pairs)
    result = accuracy(preference_model, pairs)
    if logger is not None:
        score = result[ACCURACY]
        shown = "none" if score is None else f"{score:.3f}"
        logger.log(
            f"Held-out accuracy: {shown} on {result[NON_TIED]} non-tied of "
            f"{num_pairs} pairs ({MEANING})"
        )
    return result
