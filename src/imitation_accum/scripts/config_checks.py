"""Config checks of the experiments' sacred hooks, naming the full key they reject."""

import dataclasses
import difflib
import functools
import inspect
import pathlib
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import gymnasium as gym
import torch as th
from imitation.rewards import reward_nets
from imitation.scripts.ingredients import reward as reward_ingredient
from imitation.util import networks
from sacred import initialize
from sacred.utils import ConfigAddedError, convert_to_nested_dict

from imitation_accum import _validation
from imitation_accum.engine import arguments as engine_arguments
from imitation_accum.envs import atari
from imitation_accum.nets import shaped
from imitation_accum.planning import budget
from imitation_accum.preference import arguments

#: Builds an optimizer over given parameters.
MakeOptimizer = Callable[[Iterator[th.nn.Parameter]], th.optim.Optimizer]


def check_environment(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: the ``environment`` section, naming the key it refuses.

    Raises:
        TypeError: naming a key of the wrong type.
        ValueError: naming ``environment.gym_id`` (with near matches) or a key out
            of range.
    """
    del command_name, logger
    check_environment_section(config["environment"])
    return {}


def check_environment_section(env: Mapping[str, Any], make_kwargs: bool = True) -> None:
    """:func:`check_environment` of the ``environment`` section.

    ``make_kwargs``: whether to check ``env_make_kwargs`` against ``gym_id``'s
    environment (``train_reward_model`` may build another, and checks them then).
    """
    gym_id = env["gym_id"]
    try:
        gym.spec(gym_id)
    except (gym.error.Error, ModuleNotFoundError) as error:
        near = difflib.get_close_matches(gym_id, list(gym.registry), n=3, cutoff=0.8)
        raise ValueError(atari.unknown_id_message(gym_id, near)) from error
    _validation.positive_int(
        "environment.max_episode_steps", env["max_episode_steps"], optional=True
    )
    _validation.positive_int("environment.num_vec", env["num_vec"])
    _validation.boolean("environment.parallel", env["parallel"])
    if make_kwargs:
        check_env_make_kwargs(gym_id, env["env_make_kwargs"])


#: Entry points that pass their ``**kwargs`` on to ``gym.make`` of another id, and
#: the registered keyword argument holding that id.
_MAKES_ANOTHER_ID = {
    "imitation_accum.envs.atari:make_atari_env": "game_id",
    "seals.atari:make_atari_env": "atari_env_id",
}


def env_arguments(spec: Any) -> Optional[List[str]]:
    """What ``gym.make(spec, **kwargs)`` takes as ``kwargs`` (``None``: anything).

    ``gym.make``'s own arguments and the entry point's, read from gymnasium's
    registry without building anything. An entry point taking ``**kwargs`` is
    followed where it passes them to ``gym.make`` of another id (the Atari entry
    points of seals and of this package); otherwise it may take any.
    """
    make_params = inspect.signature(gym.make).parameters.values()
    accepted = [
        p.name
        for p in make_params
        if p.kind == p.KEYWORD_ONLY
        or (p.kind == p.POSITIONAL_OR_KEYWORD and p.name != "id")
    ]
    creator: Any = spec.entry_point
    if isinstance(creator, str):
        creator = gym.envs.registration.load_env_creator(creator)
    params, takes_any = _parameters(creator)
    accepted += list(params)
    if not takes_any:
        return accepted
    inner_key = _MAKES_ANOTHER_ID.get(str(spec.entry_point))
    inner_id = spec.kwargs.get(inner_key) if inner_key else None
    inner = None if inner_id is None else env_arguments(gym.spec(inner_id))
    return None if inner is None else accepted + inner


def check_env_make_kwargs(gym_id: str, kwargs: object) -> None:
    """Checks ``environment.env_make_kwargs`` against what the environment takes.

    See :func:`env_arguments`; imitation passes ``max_episode_steps`` itself.

    Raises:
        ValueError: if ``kwargs`` is not a dict, or names an argument the
            environment does not take (with near matches).
    """
    key = "environment.env_make_kwargs"
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"{key}={kwargs!r} must be a dict of keyword arguments")
    spec = gym.spec(gym_id)
    accepted = env_arguments(spec)
    if accepted is not None:
        accepted = [name for name in accepted if name != "max_episode_steps"]
        target = f"{gym_id!r} ({spec.entry_point})"
        _validation.known_names(key, kwargs, dict.fromkeys(accepted), target)


#: imitation's logger formats (``imitation.util.logger``; SB3's and ``wandb``).
LOG_FORMATS = ("stdout", "log", "json", "csv", "tensorboard", "wandb")


def check_log_format_strs(formats: object) -> None:
    """Checks ``logging.log_format_strs``: a list (or tuple) of imitation's formats.

    A string is refused, not read as one format: imitation's logging ingredient
    adds a list to it, and its logger would take each character for a format.

    Raises:
        ValueError: naming ``logging.log_format_strs`` and the formats.
    """
    key = "logging.log_format_strs"
    known = f"(formats: {', '.join(LOG_FORMATS)})"
    if not isinstance(formats, (list, tuple)):
        kind = ", not a string" if isinstance(formats, str) else ""
        raise ValueError(
            f"{key}={formats!r} must be a list of formats{kind}, such as "
            f"{key}=['csv', 'stdout'] (on a command line, quote the whole "
            f"update) {known}"
        )
    for value in formats:
        if value not in LOG_FORMATS:
            near = difflib.get_close_matches(str(value), LOG_FORMATS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"{key}: {value!r} is not a log format{hint} {known}")


def check_logging_updates(updates: Dict[str, Any]) -> Dict[str, Any]:
    """An update hook: a given ``logging.log_format_strs`` is a list of formats.

    Runs on the user's updates, before sacred builds the config: imitation's
    logging ingredient adds a list to the value there, so a string (or a tuple)
    would fail with a ``TypeError`` that names no key. A tuple becomes a list.

    Raises:
        ValueError: as :func:`check_log_format_strs`.
    """
    section = updates.get("logging")
    if isinstance(section, dict) and "log_format_strs" in section:
        check_log_format_strs(section["log_format_strs"])
        section["log_format_strs"] = list(section["log_format_strs"])
    return updates


def check_run_settings(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: sacred's ``seed`` and imitation's ``logging`` ingredient.

    Raises:
        ValueError: naming ``seed`` (an int in [0, 2**32), as numpy seeds) or
            ``logging.log_format_strs``.
    """
    del command_name, logger
    seed = config.get("seed")
    if seed is not None:
        _validation.non_negative_int("seed", seed)
        if seed >= 2**32:
            raise ValueError(f"seed={seed!r} must be below 2**32")
    logging_config = config.get("logging")
    if isinstance(logging_config, Mapping) and "log_format_strs" in logging_config:
        check_log_format_strs(logging_config["log_format_strs"])
    return {}


def check_demonstrations(
    config: Dict[str, Any], command_name: str, logger: Any
) -> Dict[str, Any]:
    """Config hook: demonstrations exist locally, or can be generated.

    Raises:
        ValueError: naming ``demonstrations.source``, ``demonstrations.path`` or
            ``demonstrations.n_expert_demos``.
    """
    del command_name, logger
    demos = config["demonstrations"]
    sources = ("local", "huggingface", "generated")
    if demos["source"] not in sources:
        raise ValueError(
            f"demonstrations.source={demos['source']!r} must be one of {sources}"
        )
    if demos["source"] == "generated":
        # imitation's default: rolls out expert.policy_type (by default downloaded
        # from the HuggingFace hub), n_expert_demos episodes.
        if demos.get("n_expert_demos") is None:
            raise ValueError(
                "demonstrations.source='generated' (imitation's default) needs "
                "demonstrations.n_expert_demos and an expert (expert.policy_type; "
                "its default downloads one). Offline, give demonstrations.source="
                "local demonstrations.path=DIR, saved by python -m "
                "imitation_accum.integrations.demonstrations (docs/adversarial.md)"
            )
        _validation.positive_int(
            "demonstrations.n_expert_demos", demos["n_expert_demos"]
        )
    if demos["source"] != "local":
        return {}
    path = demos["path"]
    if path is None:
        raise ValueError(
            "demonstrations.source='local' needs demonstrations.path: trajectories "
            "saved with imitation.data.serialize.save"
        )
    if not pathlib.Path(path).exists():
        raise ValueError(f"demonstrations.path={path!r}: no such file or directory")
    return {}


def _parameters(target: Any) -> Tuple[Dict[str, inspect.Parameter], bool]:
    """``target``'s keyword parameters, and whether it takes any other.

    A class passing ``**kwargs`` to its base's ``__init__`` (seals'
    ``FixedHorizonCartPole`` to gymnasium's ``CartPoleEnv``) takes what the first
    ``__init__`` without them takes; a callable whose signature cannot be read
    (a builtin) takes any.
    """
    functions = [target]
    if isinstance(target, type):
        functions = [
            vars(k)["__init__"] for k in target.__mro__ if "__init__" in vars(k)
        ]
    found: Dict[str, inspect.Parameter] = {}
    for function in functions:
        try:
            try:
                signature = inspect.signature(function, eval_str=True)
            except (NameError, TypeError):  # an annotation that does not resolve
                signature = inspect.signature(function)
        except (TypeError, ValueError):
            return found, True
        params = signature.parameters.values()
        for p in params:
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                found.setdefault(p.name, p)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return found, False
    return found, True


def check_booleans(
    key: str, kwargs: Mapping[str, Any], params: Mapping[str, inspect.Parameter]
) -> None:
    """Checks the ``kwargs`` whose parameter in ``params`` is annotated ``bool``.

    ``Optional[bool]`` also takes ``None``.

    Raises:
        TypeError: naming ``<key>.<name>`` of a value that is not a bool.
    """
    for name, value in kwargs.items():
        param = params.get(name)
        annotation = None if param is None else param.annotation
        where = f"{key}.{name}" if key else name
        if annotation in (bool, "bool"):
            _validation.boolean(where, value)
        elif annotation in (Optional[bool], "Optional[bool]"):
            _validation.boolean(where, value, optional=True)


def check_keywords(
    key: str,
    kwargs: Mapping[str, Any],
    cls: type,
    exclude: Iterable[str] = (),
    target: Optional[str] = None,
) -> None:
    """Checks that config ``key``'s ``kwargs`` are keyword arguments of ``cls``.

    Follows ``**kwargs`` up the method resolution order, less ``exclude`` (what the
    experiment passes itself); ``target`` names the receiver (default: ``cls``).
    Arguments annotated ``bool`` take only bools.

    Raises:
        ValueError: naming the first unknown key, with near matches.
        TypeError: naming a bool argument given another value.
    """
    params, _ = _parameters(cls)
    excluded = set(exclude)
    names = [name for name in params if name not in excluded]
    _validation.known_names(key, kwargs, names, target or cls.__name__)
    check_booleans(key, kwargs, params)


def check_reward_trainer_kwargs(
    kwargs: Mapping[str, Any],
    trainer_cls: type,
    exclude: Iterable[str],
    optimizer_cls: Optional[type] = None,
) -> Tuple[arguments.TrainerSettings, MakeOptimizer]:
    """Checks ``reward_trainer_kwargs``, which ``trainer_cls`` gets less ``exclude``.

    ``optimizer_cls``: the class, if the config names it otherwise than by class.

    Returns:
        The trainer's settings, as its constructor parses them, and what builds
        its optimizer.

    Raises:
        TypeError: naming a ``reward_trainer_kwargs.<key>`` of the wrong type.
        ValueError: naming the first unknown or invalid one.
    """
    key = "reward_trainer_kwargs"
    check_keywords(key, kwargs, trainer_cls, exclude, "CrossEntropyRewardTrainer")
    fields = {f.name for f in dataclasses.fields(arguments.TrainerSettings)}
    settings = arguments.TrainerSettings(
        **{k: v for k, v in kwargs.items() if k in fields}, key_prefix=f"{key}."
    )
    default = _parameters(trainer_cls)[0]["optimizer_cls"].default
    cls = optimizer_cls or kwargs.get("optimizer_cls", default)
    optimizer_kwargs = kwargs.get("optimizer_kwargs")
    engine_arguments.check_optimizer(
        cls,
        optimizer_kwargs,
        defaults={"lr": settings.lr},
        cls_name=f"{key}.optimizer_cls",
        kwargs_name=f"{key}.optimizer_kwargs",
    )
    return settings, functools.partial(
        cls, **{"lr": settings.lr, **(optimizer_kwargs or {})}
    )


def training_device(key: str, value: object) -> th.device:
    """The device config ``key`` names (``"auto"``: the first GPU if any, as SB3's).

    Raises:
        ValueError: naming ``key`` if ``value`` is not a device, or names a CUDA
            device this machine does not have.
    """
    if value == "auto":
        return th.device("cuda" if th.cuda.is_available() else "cpu")
    try:
        device = th.device(value)  # type: ignore[call-overload]
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"{key}={value!r} is not a device: give 'auto', 'cpu', 'cuda' or 'cuda:N'"
        ) from error
    if device.type == "cuda":
        count = th.cuda.device_count() if th.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"{key}={value!r}: this machine has no CUDA device; give 'cpu' or "
                "'auto'"
            )
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"{key}={value!r}: this machine has {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1}"
            )
    return device


def check_on_device(
    settings: Any,
    device_key: str,
    device_value: object,
    trains: bool,
    logger: Any,
) -> None:
    """Runs the trainer's ``settings.check_device`` on the device config key names.

    If the command does not train (``print_config``), a config meant for another
    machine is only warned about (``logger``: the hook's).

    Raises:
        ValueError: naming the setting and ``device_key``, if the command trains.
    """
    try:
        device = training_device(device_key, device_value)
        try:
            settings.check_device(device)
        except ValueError as error:
            raise ValueError(f"{error} ({device_key}={device_value!r})") from None
    except ValueError as error:
        if trains:
            raise
        logger.warning(f"{error} (only a warning: this command does not train)")


def check_budget_holds_net(
    config: Mapping[str, Any],
    command_name: str,
    key: str,
    memory_budget: Optional[budget.Budget],
    make_optimizer: MakeOptimizer,
) -> None:
    """Refuses a budget in bytes (config ``key``) too small for the net's training.

    The trainer's own check, made before the run directory exists: one environment
    is made (and closed) for its spaces and the reward net built on the CPU, as
    imitation's ingredient builds it for ``command_name``. Only for a single net.

    Raises:
        ValueError: naming ``key``, the bytes needed and the bytes given.
    """
    reward = _reward_net(config, command_name)
    if not isinstance(memory_budget, int) or reward is None:
        return
    _, net_cls, net_kwargs, layer = reward
    if not (
        isinstance(net_cls, type)
        and issubclass(net_cls, reward_nets.RewardNet)
        and not issubclass(net_cls, reward_nets.RewardEnsemble)
    ):
        return
    environment = config["environment"]
    env = gym.make(environment["gym_id"], **environment["env_make_kwargs"])
    env.close()  # only its spaces are read, as the reward ingredient reads a venv's
    # The reward ingredient's builder (under patched(), the package's, which
    # leaves a CNN net's normalize_input_layer out).
    net = reward_ingredient._make_reward_net(
        env,  # type: ignore[arg-type]  # only its two spaces are read
        net_cls,
        net_kwargs,
        layer,
    )
    budget.check_holds_training_state(
        memory_budget,
        make_optimizer(net.parameters()),
        "the reward net's parameters, their gradients and the optimizer state",
        key,
    )


def _reward_net(
    config: Mapping[str, Any], command_name: str
) -> Optional[Tuple[Mapping[str, Any], Any, Dict[str, Any], Any]]:
    # The reward ingredient (None if absent) and the net class, its arguments and
    # the output norm layer it gives command_name.
    reward = config.get("reward")
    if not isinstance(reward, Mapping):
        return None
    specific = reward.get("algorithm_specific", {}).get(command_name, {})
    net_kwargs = {**reward.get("net_kwargs", {}), **specific.get("net_kwargs", {})}
    return (
        reward,
        specific.get("net_cls", reward.get("net_cls")),
        net_kwargs,
        specific.get("normalize_output_layer", reward.get("normalize_output_layer")),
    )


def check_checkpointing(
    config: Mapping[str, Any], command_name: str, key: str, enabled: object
) -> None:
    """Refuses ``activation_checkpointing`` with a reward net that has no CNN.

    An error, not a warning: checkpointing would do nothing there, and the
    trainer refuses it anyway, though only once the run has started.

    Raises:
        ValueError: naming ``key`` and the net class (imitation's MLP nets).
    """
    found = _reward_net(config, command_name)
    if enabled is not True or found is None:
        return
    reward, net_cls, _, _ = found
    if isinstance(net_cls, type) and issubclass(net_cls, reward_nets.RewardEnsemble):
        net_cls = (reward.get("ensemble_member_config") or {}).get("net_cls")
    mlp = (reward_nets.BasicRewardNet, reward_nets.BasicShapedRewardNet)
    if isinstance(net_cls, type) and issubclass(net_cls, mlp):
        raise ValueError(
            f"{key}=True: reward.net_cls={net_cls.__name__} has no convolutions to "
            "checkpoint (it needs a CnnRewardNet or a net holding a "
            "BasicPotentialCNN); set it to False"
        )


def check_counts(config: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Checks that the top-level ``keys`` in ``config`` are positive whole numbers."""
    for key in keys:
        if key in config:
            _validation.positive_count(key, config[key])


def check_reward_ingredient(config: Mapping[str, Any], command_name: str) -> None:
    """Checks imitation's ``reward`` ingredient: net class and sizes."""
    found = _reward_net(config, command_name)
    if found is None:
        return
    reward, net_cls, net_kwargs, layer = found
    if not (isinstance(net_cls, type) and issubclass(net_cls, reward_nets.RewardNet)):
        raise ValueError(
            f"reward.net_cls={getattr(net_cls, '__name__', net_cls)!r} is not an "
            "imitation RewardNet class (such as BasicRewardNet or CnnRewardNet); "
            "a class cannot be named on the command line: set it in a named "
            "config or a config file"
        )
    if issubclass(net_cls, reward_nets.RewardEnsemble):
        # imitation builds the members from ensemble_member_config alone.
        member = reward.get("ensemble_member_config") or {}
        member_cls = member.get("net_cls")
        if isinstance(member_cls, type) and issubclass(
            member_cls, reward_nets.RewardNet
        ):
            check_net_kwargs(
                member_cls,
                member.get("net_kwargs", {}),
                "reward.ensemble_member_config.net_kwargs",
            )
        _check_norm_class(
            "reward.ensemble_member_config.normalize_output_layer",
            member.get("normalize_output_layer"),
        )
    else:
        check_net_kwargs(net_cls, net_kwargs)
        _check_norm_class("reward.normalize_output_layer", layer)
    hid_sizes = net_kwargs.get("hid_sizes")
    if hid_sizes is not None:
        if not isinstance(hid_sizes, (list, tuple)):
            raise ValueError(
                f"reward.net_kwargs.hid_sizes={hid_sizes!r} must be a list of "
                "positive ints"
            )
        for size in hid_sizes:
            _validation.positive_int("reward.net_kwargs.hid_sizes[...]", size)
    ensemble_size = reward.get("ensemble_size")
    if ensemble_size is not None:
        _validation.positive_int("reward.ensemble_size", ensemble_size)


#: Where reward nets whose constructor takes ``**kwargs`` pass them (imitation's
#: nets and ours), and the builder's arguments the net sets itself.
_NET_KWARGS_TARGETS = (
    (shaped.CnnShapedRewardNet, networks.build_cnn, ("hid_channels",)),
    (reward_nets.CnnRewardNet, networks.build_cnn, ()),
    (reward_nets.BasicShapedRewardNet, networks.build_mlp, ("hid_sizes",)),
    (reward_nets.BasicRewardNet, networks.build_mlp, ()),
)
_SET_BY_NETS = ("in_size", "in_channels", "out_size", "squeeze_output")


def net_arguments(net_cls: type) -> Optional[Dict[str, inspect.Parameter]]:
    """The keyword arguments ``net_cls`` takes (``None``: unknown, it takes any).

    A constructor's ``**kwargs`` is followed for imitation's MLP and CNN nets and
    this package's ``CnnShapedRewardNet``, whose ``**kwargs`` go to imitation's
    ``build_mlp``/``build_cnn``.
    """
    params = {
        name: p
        for name, p in _parameters(net_cls)[0].items()
        if name not in ("observation_space", "action_space")
    }
    takes_any = any(
        p.kind == p.VAR_KEYWORD
        for p in inspect.signature(vars(net_cls)["__init__"]).parameters.values()
    )
    if not takes_any:
        return params
    for cls, builder, set_by_net in _NET_KWARGS_TARGETS:
        if issubclass(net_cls, cls):
            set_by_net = (*_SET_BY_NETS, *set_by_net)
            extra = _parameters(builder)[0].items()
            return {**{n: p for n, p in extra if n not in set_by_net}, **params}
    return None


def check_net_kwargs(
    net_cls: type, net_kwargs: Mapping[str, Any], key: str = "reward.net_kwargs"
) -> None:
    """Checks config ``key``'s ``net_kwargs`` against ``net_cls``'s constructor.

    ``normalize_input_layer`` is left to imitation's reward ingredient and the
    patch's hook (an image net takes none).

    Raises:
        ValueError: naming ``<key>.<name>`` that ``net_cls`` does not take.
        TypeError: naming a bool argument given another value.
    """
    accepted = net_arguments(net_cls)
    if accepted is None:
        return
    net_kwargs = {k: v for k, v in net_kwargs.items() if k != "normalize_input_layer"}
    _validation.known_names(key, net_kwargs, accepted, net_cls.__name__)
    check_booleans(key, net_kwargs, accepted)


def _check_norm_class(key: str, layer: object) -> None:
    # An output normalization layer: None or a class of imitation's norms.
    if layer is None or (
        isinstance(layer, type) and issubclass(layer, networks.BaseNorm)
    ):
        return
    raise ValueError(
        f"{key}={getattr(layer, '__name__', layer)!r} must be None or an imitation "
        "norm class (RunningNorm, EMANorm); a class cannot be named on the command "
        "line: use the reward ingredient's named configs normalize_output_disable, "
        "normalize_output_running or normalize_output_ema"
    )


def check_preference_model_kwargs(kwargs: Any) -> None:
    """``preference_model_kwargs``: a dict of ``PreferenceModel`` arguments in range."""
    if not isinstance(kwargs, Mapping):
        raise TypeError(
            f"preference_model_kwargs={kwargs!r} must be a dict of PreferenceModel "
            "arguments (noise_prob, discount_factor, threshold)"
        )
    arguments.check_preference_model_values(kwargs, "preference_model_kwargs.")


class UnknownConfigKeyError(ConfigAddedError, ValueError):
    """A config key no part of the experiment reads (sacred's ``ConfigAddedError``).

    Also a ``ValueError``, as the package's other config checks raise.
    """

    def __init__(self, key: str, message: str) -> None:
        """Names ``key`` in ``message``; sacred's command line prints it alone."""
        super().__init__(
            key,
            message=message,
            print_conflicting_configs=False,
            print_suggestions=False,
        )


def _flat_keys(updates: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in updates.items():
        if name == "__doc__":  # a config scope's docstring, not a key
            continue
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            yield from _flat_keys(value, f"{key}.")
        else:
            yield key


def check_known_keys(
    ex: Any, config_updates: Mapping[str, Any], named_configs: Sequence[str]
) -> None:
    """Refuses a key of the updates or named configs that ``ex`` does not know.

    sacred's own rule, which imitation's experiments apply: at the root and in each
    ingredient, a key must be a default there, an argument of a captured function
    there, a sub-ingredient, or ``seed``; keys inside a dict-valued entry
    (``reward_trainer_kwargs``, ...) are left to the hooks. The config scopes and
    named configs are evaluated as sacred does, nothing is run. (sacred misses such
    keys once an experiment adds a config dict after its scopes, as
    ``ex.add_config`` does.)

    Raises:
        UnknownConfigKeyError: naming the first unknown key, with near matches.
    """
    scaffolding = initialize.create_scaffolding(
        ex, initialize.gather_ingredients_topological(ex)
    )
    given = list(_flat_keys(convert_to_nested_dict(dict(config_updates))))
    for named in named_configs:
        scaffold, name = initialize.get_scaffolding_and_config_name(named, scaffolding)
        scaffold.gather_fallbacks()
        for key in _flat_keys(scaffold.run_named_config(name)):
            given.append(f"{scaffold.path}.{key}" if scaffold.path else key)
    for scaffold in scaffolding.values():  # the defaults, as sacred's phase 3
        scaffold.gather_fallbacks()
        scaffold.set_up_config()
    paths = sorted(scaffolding, key=len, reverse=True)
    for key in given:
        path = next(p for p in paths if not p or key.startswith(f"{p}."))
        scaffold = scaffolding[path]
        name = key[len(path) + 1 :].split(".")[0] if path else key.split(".")[0]
        known = set(scaffold.config) | {"seed"}
        known |= {arg.split(".")[0] for arg in scaffold.captured_args}
        known |= {p[len(path) + 1 :].split(".")[0] for p in scaffolding if p != path}
        known = {k for k in known if k and not k.startswith("_")}
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            where = f"the {path!r} ingredient" if path else f"{ex.path}"
            raise UnknownConfigKeyError(
                key,
                f"{key}: no such config key in {where}{hint} "
                f"(`print_config` lists them)",
            )
