"""Whole-dataset checks of preference pairs against an environment's spaces.

Run before the first step (by ``CrossEntropyRewardTrainer.train`` and the offline
experiment), so that a bad pair is named by its index before any parameter
changes: an item that is not a pair of trajectories, observations or actions of
another shape, not one more observation than actions, actions of the wrong dtype
or out of range, NaN observations, a preference outside [0, 1]. The checks work
on whole arrays, a block at a time; integer observations (Atari frames) cannot be
NaN and are not read.
"""

import collections
import itertools
from typing import Any, DefaultDict, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
from imitation.data import types
from torch.utils import data as data_th

from imitation_accum.preference.dataset import (
    N_COLUMNS,
    Column,
    ImitationPreferenceDataset,
    PreferenceDataset,
)

#: At most this many problems are listed in one error message.
MAX_LISTED = 5
#: Bytes of fragment arrays concatenated (or gathered) at a time.
BLOCK_BYTES = 64 * 2**20

_INTEGRAL = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
_PAIR = 2  # the "side" of a pair's own problems, listed after its fragments'

#: ``(position, side) -> problems in words``; sides 0 and 1 are the fragments.
Problems = DefaultDict[Tuple[int, int], List[str]]


def _outside(acts: np.ndarray, space: gym.Space) -> Optional[np.ndarray]:
    """Which action entries lie outside ``space`` (``None``: not checked)."""
    if isinstance(space, gym.spaces.Discrete):
        offset = acts - space.start
        return (offset < 0) | (offset >= space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (acts < 0) | (acts >= space.nvec)
    if isinstance(space, gym.spaces.MultiBinary):
        return (acts != 0) & (acts != 1)
    if isinstance(space, gym.spaces.Box):
        with np.errstate(invalid="ignore"):
            return ~np.isfinite(acts) | (acts < space.low) | (acts > space.high)
    return None


def _first_bad(
    values: np.ndarray, lengths: np.ndarray, action_space: Optional[gym.Space]
) -> Dict[int, int]:
    """Fragments laid end to end in ``values``: each bad one's first bad row.

    A row is bad if an entry lies outside ``action_space`` or, without one, is
    not finite.
    """
    if action_space is None:
        bad_entries: Optional[np.ndarray] = ~np.isfinite(values)
    else:
        bad_entries = _outside(values, action_space)
    if bad_entries is None or not bad_entries.any():
        return {}
    bad = np.flatnonzero(np.asarray(bad_entries).reshape(len(values), -1).any(axis=1))
    starts = np.cumsum(lengths) - lengths
    owners, first = np.unique(
        np.searchsorted(starts, bad, side="right") - 1, return_index=True
    )
    return {int(o): int(bad[f] - starts[o]) for o, f in zip(owners, first)}


def _blocks(nbytes: np.ndarray) -> List[Tuple[int, int]]:
    """``[start, stop)`` runs of fragments of about :data:`BLOCK_BYTES` each."""
    if not len(nbytes):
        return []
    window = (np.cumsum(nbytes) - nbytes) // BLOCK_BYTES  # where each one starts
    cuts = [0, *(np.flatnonzero(np.diff(window)) + 1).tolist(), len(nbytes)]
    return list(itertools.pairwise(cuts))


def _first_bad_in_blocks(
    arrays: Sequence[np.ndarray], action_space: Optional[gym.Space]
) -> Dict[int, int]:
    """:func:`_first_bad` over separate arrays, concatenated a block at a time."""
    found = {}
    for start, stop in _blocks(np.array([a.nbytes for a in arrays], np.int64)):
        block = arrays[start:stop]
        values = block[0] if len(block) == 1 else np.concatenate(block)
        lengths = np.array([len(a) for a in block], np.int64)
        for owner, step in _first_bad(values, lengths, action_space).items():
            found[start + owner] = step
    return found


def _action_kind_problem(
    shape: Tuple[int, ...], dtype: np.dtype, action_space: gym.Space
) -> Optional[str]:
    """What is wrong with actions of this shape and dtype (``None``: nothing)."""
    act_shape = tuple(action_space.shape or ())
    if tuple(shape) != act_shape:
        return f"has actions of shape {tuple(shape)}, the environment {act_shape}"
    if isinstance(action_space, _INTEGRAL) and not np.issubdtype(dtype, np.integer):
        return (
            f"has {dtype} actions for the environment's "
            f"{type(action_space).__name__} space (integers expected)"
        )
    if not np.issubdtype(dtype, np.number) and not np.issubdtype(dtype, np.bool_):
        return f"has {dtype} actions (numbers expected)"
    return None


def _outside_message(action_space: gym.Space, step: int, action: np.ndarray) -> str:
    return (
        f"has an action outside the environment's action space {action_space} "
        f"(step {step}: {action.tolist()!r})"
    )


def _non_finite_message(step: int) -> str:
    return f"has a non-finite observation (step {step})"


def _preference_problems(
    problems: Problems, positions: Sequence[int], preferences: Sequence[Any]
) -> None:
    values = [np.asarray(p) for p in preferences]
    numeric = [v.shape == () and np.issubdtype(v.dtype, np.number) for v in values]
    for position, value, is_number in zip(positions, values, numeric):
        if not is_number or not np.isfinite(value) or not 0 <= value <= 1:
            problems[(position, _PAIR)].append(
                f"has preference {value.tolist()!r} (in [0, 1] expected)"
            )


def _trajectory_arrays(fragment: Any) -> Tuple[Optional[str], Any, Any]:
    """``(problem, obs, acts)`` of one fragment; the arrays if no problem."""
    obs, acts = getattr(fragment, "obs", None), getattr(fragment, "acts", None)
    if isinstance(obs, (types.DictObs, dict)):
        return "has dictionary observations (not supported)", None, None
    if obs is not None and acts is not None:
        obs, acts = np.asarray(obs), np.asarray(acts)
        if obs.ndim and acts.ndim and obs.dtype != object and acts.dtype != object:
            return None, obs, acts
    kind = type(fragment).__name__
    return f"is not a trajectory with array obs and acts (a {kind})", None, None


def _items_problems(
    dataset: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> Problems:
    """The problems of a dataset of ``((fragment1, fragment2), preference)`` items."""
    problems: Problems = collections.defaultdict(list)
    if isinstance(dataset, ImitationPreferenceDataset):  # its lists, as they are
        pairs = zip(dataset.fragments1, dataset.fragments2)
        items: Sequence[Any] = list(zip(pairs, dataset.preferences))
    else:
        items = [dataset[i] for i in range(len(dataset))]
    keys: List[Tuple[int, int]] = []  # fragments with arrays, by (position, side)
    all_obs: List[np.ndarray] = []
    all_acts: List[np.ndarray] = []
    positions, preferences = [], []
    for position, item in enumerate(items):
        try:
            (first, second), preference = item
        except (TypeError, ValueError):
            problems[(position, _PAIR)].append(
                "is not ((fragment1, fragment2), preference)"
            )
            continue
        positions.append(position)
        preferences.append(preference)
        for side, fragment in enumerate((first, second)):
            problem, obs, acts = _trajectory_arrays(fragment)
            if problem is not None:
                problems[(position, side)].append(problem)
            else:
                keys.append((position, side))
                all_obs.append(obs)
                all_acts.append(acts)
    obs_shape = tuple(observation_space.shape or ())
    float_obs, in_kind = [], []
    for i, (key, obs, acts) in enumerate(zip(keys, all_obs, all_acts)):
        if tuple(obs.shape[1:]) != obs_shape:
            problems[key].append(
                f"has observations of shape {tuple(obs.shape[1:])}, the "
                f"environment {obs_shape}"
            )
        elif np.issubdtype(obs.dtype, np.floating):
            float_obs.append(i)
        if len(acts) < 1:
            problems[key].append("has no transitions")
        elif len(obs) != len(acts) + 1:
            problems[key].append(
                f"has {len(obs)} observations for {len(acts)} actions "
                "(one more expected)"
            )
        kind_problem = _action_kind_problem(acts.shape[1:], acts.dtype, action_space)
        if kind_problem is not None:
            problems[key].append(kind_problem)
        else:
            in_kind.append(i)
    checked = [all_obs[i] for i in float_obs]
    for j, step in _first_bad_in_blocks(checked, None).items():
        problems[keys[float_obs[j]]].insert(0, _non_finite_message(step))
    checked = [all_acts[i] for i in in_kind]
    for j, step in _first_bad_in_blocks(checked, action_space).items():
        problems[keys[in_kind[j]]].append(
            _outside_message(action_space, step, checked[j][step])
        )
    _preference_problems(problems, positions, preferences)
    return problems


def _store_problems(
    store: PreferenceDataset,
    selection: np.ndarray,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> Problems:
    """The problems of pairs ``selection`` of a frame store, read from its arrays.

    A store's pairs share one observation shape and one action shape and dtype.
    """
    problems: Problems = collections.defaultdict(list)
    if not len(selection):
        return problems
    rows = store.fragment_index(selection).reshape(-1, N_COLUMNS)  # pairs, then sides
    keys = [(position, side) for position in range(len(selection)) for side in (0, 1)]

    def each_fragment(problem: str) -> None:
        for key in keys:
            problems[key].append(problem)

    def ids(firsts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        starts = np.cumsum(counts) - counts
        return np.repeat(firsts - starts, counts) + np.arange(counts.sum())

    lengths = rows[:, Column.LENGTH]
    obs_shape = tuple(observation_space.shape or ())
    first = store.observations_at(rows[:1, Column.OBS])
    if tuple(first.shape[1:]) != obs_shape:
        each_fragment(
            f"has observations of shape {tuple(first.shape[1:])}, the "
            f"environment {obs_shape}"
        )
    elif np.issubdtype(first.dtype, np.floating):  # integer frames are not read
        counts = lengths + 1
        obs_ids = ids(rows[:, Column.OBS], counts)
        ends = np.cumsum(counts)
        for start, stop in _blocks(counts * first.nbytes):
            begin = ends[start] - counts[start]
            values = store.observations_at(obs_ids[begin : ends[stop - 1]])
            bad = _first_bad(values, counts[start:stop], None)
            for owner, step in bad.items():
                problems[keys[start + owner]].append(_non_finite_message(step))
    acts = store.actions_at(ids(rows[:, Column.TRANSITION], lengths))
    kind_problem = _action_kind_problem(acts.shape[1:], acts.dtype, action_space)
    if kind_problem is not None:
        each_fragment(kind_problem)
    else:
        starts = np.cumsum(lengths) - lengths
        for owner, step in _first_bad(acts, lengths, action_space).items():
            action = acts[starts[owner] + step]
            problems[keys[owner]].append(_outside_message(action_space, step, action))
    _preference_problems(problems, range(len(selection)), store.preferences[selection])
    return problems


def _unwrapped(dataset: Any) -> Tuple[Any, Optional[np.ndarray]]:
    """The dataset under nested ``Subset`` s, and their items' indices in it."""
    indices = None
    while isinstance(dataset, data_th.Subset):
        outer = np.asarray(dataset.indices, dtype=np.int64)
        indices = outer if indices is None else outer[indices]
        dataset = dataset.dataset
    return dataset, indices


def dataset_problems(
    dataset: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> Dict[int, List[str]]:
    """What is wrong with each pair of ``dataset``, in words.

    Args:
        dataset: Items ``((fragment1, fragment2), preference)``: imitation's
            ``PreferenceDataset``, this package's frame store, a ``Subset`` of
            either or any such sequence.
        observation_space: The environment's observation space.
        action_space: The environment's action space.

    Returns:
        Per position in ``dataset`` (of the pairs with problems, in order), its
        problems, each starting with the fragment it concerns.
    """
    base, indices = _unwrapped(dataset)
    if isinstance(base, PreferenceDataset):
        selection = np.arange(len(base)) if indices is None else indices
        found = _store_problems(base, selection, observation_space, action_space)
    else:
        found = _items_problems(dataset, observation_space, action_space)
    by_pair: Dict[int, List[str]] = {}
    for position, side in sorted(found):
        where = f"fragment {side + 1} " if side != _PAIR else ""
        texts = [f"{where}{problem}" for problem in found[(position, side)]]
        by_pair.setdefault(position, []).extend(texts)
    return by_pair


def pair_problems(
    pair: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
) -> List[str]:
    """What is wrong with one ``((fragment1, fragment2), preference)`` item.

    Returns:
        The problems, in words (empty if the pair fits the spaces).
    """
    return dataset_problems([pair], observation_space, action_space).get(0, [])


def check_dataset(
    dataset: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    name: str = "dataset",
    environment: str = "the environment",
    indices: Optional[Sequence[int]] = None,
    hint: str = "",
) -> None:
    """Checks every pair of ``dataset`` against the environment's spaces.

    Args:
        dataset: Items ``((fragment1, fragment2), preference)``, such as
            imitation's ``PreferenceDataset``, this package's frame store, or a
            ``Subset`` of either (named by the indices of the dataset under it).
        observation_space: The environment's observation space.
        action_space: The environment's action space.
        name: What the dataset is, for messages (``dataset_path='...'``).
        environment: What the environment is, for messages.
        indices: The file's index of each item, if ``dataset`` is a part of the
            file that is not a ``Subset`` (default: the item's own index).
        hint: What to do about a mismatch, appended to the message.

    Raises:
        ValueError: if the dataset is empty, or naming (by index) up to
            :data:`MAX_LISTED` pairs that do not fit and how many do not.
    """
    n_pairs = len(dataset)
    if n_pairs == 0:
        raise ValueError(f"{name} holds no preference pairs")
    names = _unwrapped(dataset)[1] if indices is None else indices
    problems = dataset_problems(dataset, observation_space, action_space)
    if not problems:
        return
    found = [
        f"pair {position if names is None else int(names[position])}: "
        f"{'; '.join(texts)}"
        for position, texts in list(problems.items())[:MAX_LISTED]
    ]
    listed = "\n  ".join(found)
    n_bad = len(problems)
    more = f"\n  ... and {n_bad - len(found)} more" if n_bad > len(found) else ""
    raise ValueError(
        f"{name}: {n_bad} of {n_pairs} pairs do not fit {environment} "
        f"(observation space {observation_space}, action space "
        f"{action_space}):\n  {listed}{more}{hint}",
    )
