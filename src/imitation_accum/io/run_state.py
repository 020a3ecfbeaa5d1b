"""An online run's state beyond its reward trainer: agent, environments, generators.

What a preference-comparison or adversarial run needs to go on as if it had not
stopped, written and read the same way for both (:func:`save_agent_and_environments`,
:func:`restore_agent_and_environments`):

- the SB3 agent as SB3 saves it (``agent.zip``), restored into the agent the run built;
- the vector environment: each layer of the agent's ``VecEnv`` stack (reward and
  buffering wrappers, ``VecNormalize`` statistics, the ``DummyVecEnv`` with its
  gymnasium environments) pickled together (``environments.pkl``). Objects the run
  rebuilds (layers, nets, the agent, ``Monitor`` log files) are pickled by name and
  resolved to the new run's on load. Environments that cannot be pickled
  (``SubprocVecEnv`` processes, emulators without pickle support) restart from
  ``reset`` with a seed derived from the run's seed and the iteration or round;
- numpy generators by name, and the global generators SB3 draws from.
"""

import hashlib
import io
import pathlib
import pickle
import random
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch as th
from stable_baselines3.common import base_class, monitor, save_util, vec_env

#: A checkpoint's files of the agent and of its environments.
AGENT, ENVIRONMENTS = "agent.zip", "environments.pkl"
#: SB3's Monitor (the name in its module may be swapped while a run starts).
_MONITOR = monitor.Monitor
#: Attributes of an SB3 agent's saved data left as the new agent has them.
_AGENT_KEPT = ("observation_space", "action_space", "policy_class", "policy_kwargs")
#: Objects a run builds itself; the environments may refer to them only by name.
_REBUILT = (th.nn.Module, base_class.BaseAlgorithm, vec_env.VecEnv)
#: Attributes of a VecEnv wrapper not pickled (derived from its class).
_LAYER_SKIPPED = ("class_attributes",)


def save_agent(agent: base_class.BaseAlgorithm) -> bytes:
    """``agent.save`` into memory: what SB3 writes to ``model.zip``."""
    buffer = io.BytesIO()
    agent.save(buffer)
    return buffer.getvalue()


def restore_agent(agent: base_class.BaseAlgorithm, saved: bytes, where: str) -> None:
    """Puts an agent saved by :func:`save_agent` back into ``agent``, built as it was.

    Its parameters and optimizer state, and SB3's own attributes (timestep and
    update counters, last observations, episode statistics, schedules).

    Raises:
        ValueError: naming ``where``, if the saved agent does not fit ``agent``.
    """
    try:
        data, params, variables = save_util.load_from_zip_file(
            io.BytesIO(saved), device=agent.device
        )
        for key, value in (data or {}).items():
            if key not in _AGENT_KEPT:
                setattr(agent, key, value)
        agent.set_parameters(params, exact_match=True, device=agent.device)
    except (ValueError, KeyError, RuntimeError) as error:
        raise ValueError(f"{where}: the saved agent does not fit: {error}") from error
    for name, value in (variables or {}).items():  # SAC's log_ent_coef and the like
        base_class.recursive_setattr(agent, f"{name}.data", value.data)


def vec_env_layers(venv: vec_env.VecEnv) -> List[vec_env.VecEnv]:
    """``venv`` and the VecEnvs it wraps, outermost first."""
    layers = [venv]
    while isinstance(layers[-1], vec_env.VecEnvWrapper):
        layers.append(layers[-1].venv)
    return layers


def _monitor_writers(base: vec_env.VecEnv) -> List[Any]:
    # The log writer of each environment's Monitor (None where it has none).
    writers = []
    for env in getattr(base, "envs", []):
        while env is not None and not isinstance(env, _MONITOR):
            env = getattr(env, "env", None)
        writers.append(None if env is None else env.results_writer)
    return writers


def _shared_objects(
    layers: List[vec_env.VecEnv], named: Mapping[str, Any]
) -> Dict[str, Any]:
    # Objects pickled by name: a resumed run has its own.
    shared = {f"layer:{i}": layer for i, layer in enumerate(layers)}
    for i, writer in enumerate(_monitor_writers(layers[-1])):
        if writer is not None:
            shared[f"monitor:{i}"] = writer
    shared.update(named)
    return shared


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, shared: Mapping[str, Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._names = {id(obj): name for name, obj in shared.items()}

    def persistent_id(self, obj: Any) -> Optional[str]:
        name = self._names.get(id(obj))
        if name is None and isinstance(obj, _REBUILT):
            # Pickled whole, it would come back as a copy the run does not use.
            raise pickle.PicklingError(
                f"the environments refer to a {type(obj).__name__} that is not "
                "among the objects a resumed run rebuilds"
            )
        return name


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, shared: Mapping[str, Any]) -> None:
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, pid: Any) -> Any:
        if pid not in self._shared:
            raise pickle.UnpicklingError(f"this run has no {pid!r}")
        return self._shared[pid]


def picklable_environments(venv: vec_env.VecEnv) -> Optional[str]:
    """Why ``venv``'s environments cannot be saved, or ``None`` if they can."""
    base = vec_env_layers(venv)[-1]
    if not isinstance(base, vec_env.DummyVecEnv):
        return (
            f"a {type(base).__name__} runs its environments elsewhere (only a "
            "DummyVecEnv's are saved)"
        )
    return None


def save_environments(venv: vec_env.VecEnv, named: Mapping[str, Any]) -> bytes:
    """Pickles the state of every layer of ``venv`` (see the module's docstring).

    ``named``: other objects the layers refer to that a run rebuilds, by name.

    Raises:
        TypeError: if ``venv`` cannot be saved (:func:`picklable_environments`).
        pickle.PicklingError, AttributeError: if a layer holds what does not pickle.
    """
    reason = picklable_environments(venv)
    if reason is not None:
        raise TypeError(reason)
    layers = vec_env_layers(venv)
    states = [
        {k: v for k, v in vars(layer).items() if k not in _LAYER_SKIPPED}
        for layer in layers
    ]
    buffer = io.BytesIO()
    _Pickler(buffer, _shared_objects(layers, named)).dump(
        {"layers": [type(layer).__qualname__ for layer in layers], "states": states}
    )
    return buffer.getvalue()


def restore_environments(
    venv: vec_env.VecEnv, saved: bytes, named: Mapping[str, Any], where: str
) -> None:
    """Puts the layer states of :func:`save_environments` back into ``venv``.

    Raises:
        ValueError: naming ``where``, if the layers differ from the saved ones.
    """
    layers = vec_env_layers(venv)
    try:
        payload = _Unpickler(io.BytesIO(saved), _shared_objects(layers, named)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
        raise ValueError(f"{where}: cannot read the environments: {error}") from error
    kinds = [type(layer).__qualname__ for layer in layers]
    if payload["layers"] != kinds:
        raise ValueError(
            f"{where} holds environments wrapped as {payload['layers']}, but this "
            f"run's are wrapped as {kinds}"
        )
    for layer, state in zip(layers, payload["states"]):
        vars(layer).update(state)


def derived_seed(seed: int, iteration: int) -> int:
    """A seed to restart environments with after ``iteration``, from the run's."""
    digest = hashlib.sha256(f"{int(seed)}:{int(iteration)}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def save_agent_and_environments(
    directory: pathlib.Path, agent: base_class.BaseAlgorithm, named: Mapping[str, Any]
) -> Optional[str]:
    """Writes :data:`AGENT` and, where they pickle, :data:`ENVIRONMENTS`.

    Args:
        directory: The checkpoint being written.
        agent: The SB3 agent; its ``get_env()`` are the environments.
        named: What the environments refer to that a run rebuilds, by name.

    Returns:
        ``None`` if the environments were saved, else why not.
    """
    (directory / AGENT).write_bytes(save_agent(agent))
    try:
        saved = save_environments(_environments(agent), named)
    except (TypeError, AttributeError, ValueError, pickle.PicklingError) as error:
        return str(error)
    (directory / ENVIRONMENTS).write_bytes(saved)
    return None


def _environments(agent: base_class.BaseAlgorithm) -> vec_env.VecEnv:
    venv = agent.get_env()
    if venv is None:
        raise TypeError(f"the {type(agent).__name__} agent has no environments")
    return venv


def restore_agent_and_environments(
    checkpoint: pathlib.Path,
    agent: base_class.BaseAlgorithm,
    named: Mapping[str, Any],
    seed: int,
) -> Optional[int]:
    """Puts back what :func:`save_agent_and_environments` wrote into ``checkpoint``.

    Environments it could not save restart from ``reset`` with ``seed`` (the
    agent resets them when it next learns; the action space is seeded too).

    Returns:
        ``seed`` where the environments restarted, ``None`` where restored.

    Raises:
        ValueError: naming the checkpoint, if the agent or environments differ.
    """
    where = f"checkpoint {str(checkpoint)!r}"
    restore_agent(agent, (checkpoint / AGENT).read_bytes(), where)
    venv = _environments(agent)
    if (checkpoint / ENVIRONMENTS).is_file():
        saved = (checkpoint / ENVIRONMENTS).read_bytes()
        restore_environments(venv, saved, named, where)
        return None
    venv.seed(seed)
    venv.action_space.seed(seed)
    agent._last_obs = None
    return seed


def capture_generators(generators: Mapping[str, np.random.Generator]) -> Dict[str, Any]:
    """The state of each named numpy generator, and of the global generators."""
    return {
        "named": {
            name: dict(rng.bit_generator.state) for name, rng in generators.items()
        },
        "python": _python_state(),
        "numpy": _numpy_state(),
        "torch": th.get_rng_state(),
        "cuda": th.cuda.get_rng_state_all() if th.cuda.is_available() else None,
    }


def restore_generators(
    generators: Mapping[str, np.random.Generator], saved: Mapping[str, Any], where: str
) -> None:
    """Puts states captured by :func:`capture_generators` back.

    Raises:
        ValueError: naming ``where``, if a named generator is missing or of
            another kind.
    """
    named = saved["named"]
    for name, rng in generators.items():
        if name not in named:
            raise ValueError(f"{where} holds no state of the {name} generator")
        kind = rng.bit_generator.state["bit_generator"]
        if named[name].get("bit_generator") != kind:
            raise ValueError(
                f"{where} holds a {named[name].get('bit_generator')} state for the "
                f"{name} generator, a {kind}"
            )
        rng.bit_generator.state = named[name]
    version, internal, gauss = saved["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss))
    kind, keys, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((kind, np.asarray(keys, np.uint32), pos, has_gauss, cached))
    th.set_rng_state(saved["torch"])
    cuda = saved.get("cuda")
    if cuda and th.cuda.is_available():
        for index in range(min(len(cuda), th.cuda.device_count())):
            th.cuda.set_rng_state(cuda[index], index)


def _python_state() -> Tuple[int, List[int], Optional[float]]:
    # random.getstate() as plain values (loadable with weights_only=True).
    version, internal, gauss = random.getstate()
    return int(version), [int(v) for v in internal], gauss


def _numpy_state() -> Tuple[str, th.Tensor, int, int, float]:
    # np.random.get_state() as tensors and plain values.
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    as_tensor = th.from_numpy(np.asarray(keys).astype(np.int64))
    return str(kind), as_tensor, int(pos), int(has_gauss), float(cached)
