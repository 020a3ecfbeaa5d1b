"""Swap this package's trainers into imitation, reversibly.

Unmodified imitation code (its Python API and its sacred experiments) then trains
with this package's exact accumulation. While patched, in imitation's modules:

- ``algorithms.preference_comparisons._make_reward_trainer`` is
  :func:`imitation_accum.make_reward_trainer`, ``BasicRewardTrainer`` is
  :class:`imitation_accum.CrossEntropyRewardTrainer` and ``EnsembleTrainer`` is
  :class:`imitation_accum.EnsembleTrainer`, and ``PreferenceDataset`` (what
  ``PreferenceComparisons`` keeps its comparisons in) is
  :class:`imitation_accum.PreferenceDataset`, the frame store (imitation's
  experiment then saves ``preferences.pkl`` as a frame-store directory);
- ``algorithms.adversarial.airl.AIRL`` and ``algorithms.adversarial.gail.GAIL`` are
  :class:`imitation_accum.AIRL` and :class:`imitation_accum.GAIL`;
- ``scripts.ingredients.reward._make_reward_net`` (with a config hook of the reward
  ingredient) gives CNN reward nets no ``normalize_input_layer``, which imitation
  always adds and they reject (a configured one is an error that names the key);
- ``data.huggingface_utils.TrajectoryDatasetSequence`` (what
  ``data.serialize.load`` returns) is this package's
  :class:`~imitation_accum.integrations.demonstrations.TrajectoryDatasetSequence`,
  which loads saved uint8 frames as uint8 (imitation's makes them int64);
- ``rewards.serialize.load_reward`` loads with the reward-net classes allowed
  (:func:`~imitation_accum.io.safe_loading.allowing_reward_nets`), so on torch
  2.6 and later, which load with ``weights_only=True``, it reads the reward nets
  imitation saves. Outside it, torch's allow-list is untouched.

Names are looked up in imitation's modules when imitation's code runs, so patching
reaches ``preference_comparisons.PreferenceComparisons`` (which builds its default
trainer with ``_make_reward_trainer``) and imitation's scripts. A name imported
*before* patching (``from imitation.algorithms.adversarial.airl import AIRL``) still
refers to imitation's class. Patching is process-wide.

Example:
    >>> import imitation_accum  # doctest: +SKIP
    >>> from imitation.scripts.train_preference_comparisons import (  # doctest: +SKIP
    ...     train_preference_comparisons_ex,
    ... )
    >>> with imitation_accum.patched():  # doctest: +SKIP
    ...     train_preference_comparisons_ex.run(
    ...         named_configs=["pendulum"],
    ...         config_updates={"reward_trainer_kwargs": {"minibatch_size": 4}},
    ...     )
"""

import contextlib
import importlib
from typing import Any, Callable, Dict, Iterator, List, Tuple

_Target = Tuple[str, str]  # (module, attribute)

# The original attributes, saved while patched; empty when not patched.
_originals: Dict[_Target, Any] = {}
_undo: List[Callable[[], None]] = []


def _replacements() -> Dict[_Target, Any]:
    """What each target becomes while patched (imports on first use)."""
    from imitation.algorithms import preference_comparisons as pc
    from imitation.algorithms.adversarial import airl, gail
    from imitation.data import huggingface_utils
    from imitation.rewards import serialize
    from imitation.scripts.ingredients import reward as reward_ingredient

    import imitation_accum
    from imitation_accum.integrations import demonstrations
    from imitation_accum.integrations import reward_ingredient as ingredients
    from imitation_accum.io import safe_loading

    return {
        (pc.__name__, "_make_reward_trainer"): imitation_accum.make_reward_trainer,
        (pc.__name__, "BasicRewardTrainer"): imitation_accum.CrossEntropyRewardTrainer,
        (pc.__name__, "EnsembleTrainer"): imitation_accum.EnsembleTrainer,
        (pc.__name__, "PreferenceDataset"): imitation_accum.PreferenceDataset,
        (airl.__name__, "AIRL"): imitation_accum.AIRL,
        (gail.__name__, "GAIL"): imitation_accum.GAIL,
        (reward_ingredient.__name__, "_make_reward_net"): (
            ingredients.reward_net_builder(reward_ingredient._make_reward_net)
        ),
        (huggingface_utils.__name__, "TrajectoryDatasetSequence"): (
            demonstrations.TrajectoryDatasetSequence
        ),
        (serialize.__name__, "load_reward"): safe_loading.loading_reward_nets(
            serialize.load_reward
        ),
    }


def is_patched() -> bool:
    """Whether imitation is patched now.

    Returns:
        ``True`` between :func:`patch` and :func:`unpatch`.
    """
    return bool(_originals)


def patch() -> None:
    """Swaps this package's trainers into imitation's modules (idempotent).

    See this module's docstring for what changes. Undo with :func:`unpatch`.
    """
    if is_patched():
        return
    for (module_name, attribute), replacement in _replacements().items():
        module = importlib.import_module(module_name)
        _originals[(module_name, attribute)] = getattr(module, attribute)
        setattr(module, attribute, replacement)
    from imitation_accum.integrations import reward_ingredient

    _undo.append(reward_ingredient.add_reward_config_hook())


def unpatch() -> None:
    """Restores imitation's own trainers (a no-op when not patched)."""
    for (module_name, attribute), original in _originals.items():
        setattr(importlib.import_module(module_name), attribute, original)
    _originals.clear()
    while _undo:
        _undo.pop()()


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Patches imitation for the duration of a ``with`` block.

    If imitation was already patched on entry, it stays patched on exit.

    Yields:
        Nothing; imitation is patched inside the block.

    Example:
        >>> with imitation_accum.patched():  # doctest: +SKIP
        ...     trainer = pc.PreferenceComparisons(...)  # exact accumulation
    """
    if is_patched():
        yield
        return
    patch()
    try:
        yield
    finally:
        unpatch()
