"""Swap this package's trainers into imitation, reversibly (``docs/patching.md``).

While patched (process-wide), imitation's modules name this package's reward
trainers, AIRL, GAIL and ``PreferenceDataset``; its reward ingredient builds CNN nets
without ``normalize_input_layer``; ``data.serialize.load`` keeps uint8 frames uint8;
``rewards.serialize.load_reward`` allows the reward-net classes; imitation's
``PreferenceDataset.load`` also reads a frame store (what ``save`` writes while
patched), and a pickle as imitation's class. A name imported from imitation before
patching keeps imitation's object, except that ``load``. sacred's "Added new config
entry" warnings for the entries of the ``rl_kwargs`` and ``reward.net_kwargs`` dicts
are dropped. Each trial of imitation's ``parallel`` script (Ray Tune) patches the Ray
worker that runs it, whether the script is imported before or after patching.

Example:
    >>> with imitation_accum.patched():  # doctest: +SKIP
    ...     train_preference_comparisons_ex.run(
    ...         named_configs=["pendulum"],
    ...         config_updates={"reward_trainer_kwargs": {"minibatch_size": 4}},
    ...     )
"""

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import logging
import pathlib
import re
import sys
import types
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from imitation.rewards import reward_nets

from imitation_accum.io import safe_loading
from imitation_accum.nets import shaped

_Target = Tuple[str, str]  # (module, attribute)

# The original attributes, saved while patched; empty when not patched.
_originals: Dict[_Target, Any] = {}
_undo: List[Callable[[], None]] = []

# Reward nets that read images and take no input normalization layer.
_IMAGE_REWARD_NETS = (reward_nets.CnnRewardNet, shaped.CnnShapedRewardNet)
_NORM_KEY = "reward.net_kwargs.normalize_input_layer"


def _replacements() -> Dict[_Target, Any]:
    """What each target becomes while patched (imports on first use)."""
    from imitation.algorithms import preference_comparisons as pc
    from imitation.algorithms.adversarial import airl, gail
    from imitation.data import huggingface_utils
    from imitation.rewards import reward_wrapper, serialize
    from imitation.scripts.ingredients import reward as reward_ingredient

    import imitation_accum
    from imitation_accum.integrations import demonstrations, rollout_reward

    return {
        (pc.__name__, "_make_reward_trainer"): imitation_accum.make_reward_trainer,
        (pc.__name__, "BasicRewardTrainer"): imitation_accum.CrossEntropyRewardTrainer,
        (pc.__name__, "EnsembleTrainer"): imitation_accum.EnsembleTrainer,
        (pc.__name__, "PreferenceDataset"): imitation_accum.PreferenceDataset,
        (pc.__name__, "AgentTrainer"): rollout_reward.AgentTrainer,
        (reward_wrapper.__name__, "RewardVecEnvWrapper"): (
            rollout_reward.RewardVecEnvWrapper
        ),
        (airl.__name__, "AIRL"): imitation_accum.AIRL,
        (gail.__name__, "GAIL"): imitation_accum.GAIL,
        (reward_ingredient.__name__, "_make_reward_net"): (
            _reward_net_builder(reward_ingredient._make_reward_net)
        ),
        (huggingface_utils.__name__, "TrajectoryDatasetSequence"): (
            demonstrations.TrajectoryDatasetSequence
        ),
        (serialize.__name__, "load_reward"): _allowing_reward_nets(
            serialize.load_reward
        ),
    }


def _allowing_reward_nets(load: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def safe_load(*args: Any, **kwargs: Any) -> Any:
        with safe_loading.allowing_reward_nets():
            return load(*args, **kwargs)

    return safe_load


def _is_image_reward_net(net_cls: object) -> bool:
    return isinstance(net_cls, type) and issubclass(net_cls, _IMAGE_REWARD_NETS)


def _no_input_norm(net_cls: type, layer: object) -> None:
    if layer is not None:
        raise ValueError(
            f"{_NORM_KEY}={getattr(layer, '__name__', layer)!r}: {net_cls.__name__} "
            "reads images and has no input normalization; set it to None"
        )


def _reward_net_builder(make_reward_net: Callable[..., Any]) -> Callable[..., Any]:
    # imitation's reward._make_reward_net, leaving a CNN net's
    # normalize_input_layer=None out of its arguments.
    @functools.wraps(make_reward_net)
    def build(
        venv: Any,
        net_cls: type,
        net_kwargs: Mapping[str, Any],
        normalize_output_layer: Any,
    ) -> Any:
        if _is_image_reward_net(net_cls):
            net_kwargs = dict(net_kwargs)
            _no_input_norm(net_cls, net_kwargs.pop("normalize_input_layer", None))
        return make_reward_net(venv, net_cls, net_kwargs, normalize_output_layer)

    return build


def _reward_config_hook(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    # imitation's own hook gives every net normalize_input_layer=RunningNorm
    # unless the config names one; this one, run after it, sets it to None for
    # CNN reward nets and rejects a configured layer.
    del logger
    reward = config["reward"]
    specific = reward.get("algorithm_specific", {}).get(command_name, {})
    net_cls = specific.get("net_cls", reward["net_cls"])
    if not _is_image_reward_net(net_cls):
        return {}
    net_kwargs = {**reward["net_kwargs"], **specific.get("net_kwargs", {})}
    _no_input_norm(net_cls, net_kwargs.get("normalize_input_layer"))
    return {"net_kwargs": {"normalize_input_layer": None}}


def _loading_stores(load: Callable[..., Any]) -> Callable[..., Any]:
    # imitation's PreferenceDataset.load, reading a directory as a frame store; a
    # pickle as imitation's class (plain unpickling would resolve the class name
    # to this package's while patched).
    from imitation_accum.preference import dataset

    @functools.wraps(load)
    def load_store_or_pickle(path: Any) -> Any:
        if pathlib.Path(path).is_dir():
            return dataset.PreferenceDataset.load(path)
        return dataset.read_imitation_pickle(path, str(path))

    return load_store_or_pickle


class _KwargsEntriesQuiet(logging.Filter):
    # Drops sacred's warnings about entries added to the kwargs dicts of
    # imitation's rl and reward ingredients (passed on whole, so a wrong name
    # fails in the constructor) and the per-algorithm reward net classes: every
    # Atari named config sets some.

    _PATTERN = re.compile(
        r'^Added new config entry: "(?:rl_kwargs\.|net_kwargs\.'
        r'|algorithm_specific\.(?:airl|gail)\.net_cls")'
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._PATTERN.match(str(record.msg))


# sacred logs an ingredient's warnings on the child of its root logger named by
# the ingredient's path (the root logger unless an experiment sets its own).
_QUIET_LOGGERS = ("rl", "reward")


def _quiet_kwargs_entries() -> None:
    quiet = _KwargsEntriesQuiet()
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    for logger in loggers:
        logger.addFilter(quiet)

    def undo() -> None:
        for logger in loggers:
            logger.removeFilter(quiet)

    _undo.append(undo)


# --- Ray Tune trials (imitation's parallel script) ----------------------------

#: imitation's parallel script, which imports ray: patched when it is imported, so
#: that patch() neither needs ray nor spends the seconds its import takes.
_PARALLEL = "imitation.scripts.parallel"
#: Its function building the trainable that each Ray Tune trial runs.
_TRIALS: _Target = (_PARALLEL, "_ray_tune_sacred_wrapper")


def patching_trials(make_trainable: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps imitation's ``_ray_tune_sacred_wrapper``: each trial patches its worker.

    Each trial calls :func:`patch` in the process that runs it, a Ray worker on
    this machine or on another node of a cluster, then imitation's trainable,
    which runs the trial's sacred experiment there. The worker stays patched.

    Args:
        make_trainable: imitation's function (or one wrapping it): the trial's
            experiment name, run name, base named configs and config updates in,
            a Ray Tune function trainable ``(config, reporter)`` out.

    Returns:
        A function of the same arguments, giving the patching trainable.
    """

    @functools.wraps(make_trainable)
    def make(*args: Any, **kwargs: Any) -> Callable[[Dict[str, Any], Any], Any]:
        trainable = make_trainable(*args, **kwargs)

        # imitation's trainable takes a Ray reporter and ignores it; current Ray
        # calls a trainable with the config alone, so the reporter is optional.
        def trial(config: Dict[str, Any], reporter: Any = None) -> Any:
            patch()
            return trainable(config, reporter)

        return trial

    return make


def _patch_trials(module: types.ModuleType) -> None:
    _originals[_TRIALS] = getattr(module, _TRIALS[1])
    setattr(module, _TRIALS[1], patching_trials(_originals[_TRIALS]))


class _PatchTrialsLoader(importlib.abc.Loader):
    # Runs imitation's parallel script as its own loader would, then patches it.

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(
        self, spec: importlib.machinery.ModuleSpec
    ) -> Optional[types.ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        if is_patched():
            _patch_trials(module)


class _PatchTrialsOnImport(importlib.abc.MetaPathFinder):
    # Finds imitation's parallel script as Python would, with the loader above
    # (on sys.meta_path only while patched).

    def find_spec(
        self,
        fullname: str,
        path: Optional[Sequence[str]],
        target: Optional[types.ModuleType] = None,
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != _PARALLEL:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchTrialsLoader(spec.loader)
        return spec


def _patch_ray_trials() -> None:
    if _PARALLEL in sys.modules:
        _patch_trials(sys.modules[_PARALLEL])
        return
    finder = _PatchTrialsOnImport()
    sys.meta_path.insert(0, finder)
    _undo.append(lambda: sys.meta_path.remove(finder))


def is_patched() -> bool:
    """Whether imitation is patched now (between :func:`patch` and :func:`unpatch`)."""
    return bool(_originals)


def patch() -> None:
    """Swaps this package's trainers into imitation (idempotent; :func:`unpatch`)."""
    if is_patched():
        return
    for (module_name, attribute), replacement in _replacements().items():
        module = importlib.import_module(module_name)
        _originals[(module_name, attribute)] = getattr(module, attribute)
        setattr(module, attribute, replacement)
    from imitation.scripts.ingredients import reward

    from imitation_accum.preference.dataset import ImitationPreferenceDataset

    hooks = reward.reward_ingredient.config_hooks
    hooks.append(_reward_config_hook)
    _undo.append(lambda: hooks.remove(_reward_config_hook))
    from imitation_accum.integrations import rollout_reward

    _undo.append(rollout_reward.restore_default)
    # A class attribute: also reaches imitation's class imported before patching.
    load = vars(ImitationPreferenceDataset)["load"]
    ImitationPreferenceDataset.load = staticmethod(  # type: ignore[method-assign]
        _loading_stores(load.__func__)
    )
    _undo.append(lambda: setattr(ImitationPreferenceDataset, "load", load))
    _quiet_kwargs_entries()
    _patch_ray_trials()


def unpatch() -> None:
    """Restores imitation's own trainers (a no-op when not patched)."""
    for (module_name, attribute), original in _originals.items():
        setattr(importlib.import_module(module_name), attribute, original)
    _originals.clear()
    while _undo:
        _undo.pop()()


@contextlib.contextmanager
def preference_script_run(
    *,
    env_id: Optional[str],
    initial_epoch_multiplier: float,
    comparisons_cls: Optional[Callable[..., Any]] = None,
) -> Iterator[None]:
    """Settings imitation's preference script does not pass, for one run of it.

    While open (and patched), a ``PreferenceComparisons`` built through imitation's
    module gets ``initial_epoch_multiplier`` unless given one, and the
    ``PreferenceDataset`` it keeps records ``env_id`` when saved
    (``save_preferences=True``), so ``train_reward_model`` finds the environment.

    Args:
        env_id: The run's ``environment.gym_id``.
        initial_epoch_multiplier: imitation's ``PreferenceComparisons`` argument.
        comparisons_cls: What to build instead of imitation's
            ``PreferenceComparisons`` (same arguments), e.g. a resumable one.

    Yields:
        Nothing; the two settings hold inside the block.

    Raises:
        RuntimeError: if imitation is not patched.
    """
    if not is_patched():
        raise RuntimeError("preference_script_run() needs imitation_accum.patched()")
    from imitation.algorithms import preference_comparisons as pc

    dataset_cls = pc.PreferenceDataset

    class RunDataset(dataset_cls):  # type: ignore[valid-type,misc]
        """The patched ``PreferenceDataset``, saving the run's environment id."""

        def save(self, path: Any, **kwargs: Any) -> None:
            kwargs.setdefault("env_id", env_id)
            super().save(path, **kwargs)

    # imitation's script calls its module's names when it runs: swap them meanwhile.
    swapped = {
        "PreferenceDataset": RunDataset,
        "PreferenceComparisons": functools.partial(
            comparisons_cls or pc.PreferenceComparisons,
            initial_epoch_multiplier=initial_epoch_multiplier,
        ),
    }
    originals = {name: getattr(pc, name) for name in swapped}
    for name, value in swapped.items():
        setattr(pc, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(pc, name, value)


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Patches imitation for a ``with`` block (if already patched, it stays so).

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
