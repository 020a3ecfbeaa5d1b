"""How the reward net's forward runs: precision, checkpointing, accelerator options.

None changes a step beyond round-off; each holds only while a trainer trains or a
forward runs, so the net saves and pickles as before.
"""

import bisect
import contextlib
import dataclasses
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Union

import torch as th
from imitation.rewards import reward_nets
from imitation.util import networks
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from imitation_accum import _validation
from imitation_accum.engine import host_memory

#: The values ``acceleration=`` accepts: options, a mapping of them (sacred), None.
AccelerationArg = Union["Acceleration", Mapping[str, Any], None]


@dataclasses.dataclass(frozen=True)
class Acceleration:
    """Accelerator options of a trainer; all off by default but ``reuse_host_memory``.

    Attributes:
        pinned_staging: Copy each chunk's inputs through page-locked memory on a
            side CUDA stream, a chunk ahead (:mod:`imitation_accum.engine.staging`).
        channels_last: Run the reward net's convolution stacks in the
            ``channels_last`` memory format (weights and inputs).
        compile: Run the reward net's ``forward`` through ``torch.compile`` with
            static shapes (:class:`StaticShapeForward`); not with norm layers.
        cudnn_benchmark: Turn on ``torch.backends.cudnn.benchmark`` while training.
        compile_backend: The ``torch.compile`` backend (``"aot_eager"`` compiles
            nothing and is quick to set up).
        reuse_host_memory: On a CPU, keep freed heap memory for the next chunk
            (:mod:`imitation_accum.engine.host_memory`).

    Example:
        >>> trainer = CrossEntropyRewardTrainer(  # doctest: +SKIP
        ...     preference_model, loss, rng,
        ...     acceleration=Acceleration(pinned_staging=True, channels_last=True),
        ... )
    """

    pinned_staging: bool = False
    channels_last: bool = False
    compile: bool = False
    cudnn_benchmark: bool = False
    compile_backend: str = "inductor"
    reuse_host_memory: bool = True

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.type in (bool, "bool"):
                # numpy's bools are kept as bool (frozen: set through object).
                value = _validation.boolean(
                    f"acceleration.{field.name}", getattr(self, field.name)
                )
                object.__setattr__(self, field.name, value)
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise ValueError(
                "acceleration.compile_backend must be a torch.compile backend "
                f"name, got {self.compile_backend!r}"
            )

    @property
    def any(self) -> bool:
        """Whether any option that is off by default is on."""
        return (
            self.pinned_staging
            or self.channels_last
            or self.compile
            or self.cudnn_benchmark
        )

    @classmethod
    def parse(
        cls, value: AccelerationArg, name: str = "acceleration"
    ) -> "Acceleration":
        """Checks ``value``: ``None``, an :class:`Acceleration` or a mapping of fields.

        Raises:
            TypeError: for a value of the wrong type, naming ``<name>.<field>``.
            ValueError: for an unknown field or a bad value, naming it.
        """
        if value is None:
            return cls()
        if isinstance(value, Acceleration):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(
                f"{name} must be an Acceleration, a mapping of its fields or None, "
                f"got {type(value).__name__}"
            )
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"{name}.{unknown[0]} is not an acceleration option; the options "
                f"are {sorted(known)}"
            )
        try:
            return cls(**dict(value))
        except (TypeError, ValueError) as error:
            message = str(error).replace("acceleration.", f"{name}.", 1)
            raise type(error)(message) from None

    def check_net(self, net: nn.Module, activation_checkpointing: bool = False) -> None:
        """Checks that the options suit ``net`` and ``activation_checkpointing``.

        Raises:
            ValueError: ``channels_last`` without a CNN, ``compile`` with norm
                layers or with activation checkpointing.
        """
        if self.compile and activation_checkpointing:
            raise ValueError(
                "acceleration.compile=True and activation_checkpointing=True: "
                "choose one (the compiled forward would trace the checkpointed stacks)"
            )
        if self.channels_last and not checkpointable_cnns(net):
            raise ValueError(
                "acceleration.channels_last=True needs a convolutional reward net (a "
                "CnnRewardNet or BasicPotentialCNN inside it); "
                f"{type(net).__name__} has none"
            )
        for module in net.modules() if self.compile else ():
            if isinstance(module, networks.BaseNorm):
                raise ValueError(
                    "acceleration.compile=True: the reward net holds a "
                    f"{type(module).__name__}, whose statistics the rows that pad "
                    "ragged calls to a static shape would enter; train it without "
                    "compile"
                )

    @contextlib.contextmanager
    def applied(self, net: nn.Module) -> Iterator[None]:
        """Applies the net-side options to ``net`` inside the context."""
        with contextlib.ExitStack() as stack:
            parameter = next(net.parameters(), None)
            if parameter is None or parameter.device.type == "cpu":
                stack.enter_context(host_memory.kept_for_reuse(self.reuse_host_memory))
            if self.cudnn_benchmark:
                stack.enter_context(cudnn_benchmark())
            if self.channels_last:
                stack.enter_context(channels_last(net))
            if self.compile:
                compiled = th.compile(
                    net.forward, dynamic=False, backend=self.compile_backend
                )
                stack.enter_context(
                    _forward_replaced(net, StaticShapeForward(compiled))
                )
            yield


@contextlib.contextmanager
def cudnn_benchmark() -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` on inside the context, restored after."""
    before = th.backends.cudnn.benchmark
    th.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        th.backends.cudnn.benchmark = before


DTYPES = {"bfloat16": th.bfloat16, "float16": th.float16}


def parse_autocast_dtype(
    value: object, name: str = "autocast_dtype"
) -> Optional[th.dtype]:
    """The torch dtype of ``None``, ``"bfloat16"`` or ``"float16"`` (argument ``name``).

    Raises:
        ValueError: for any other value.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(f"{name} must be None, 'bfloat16' or 'float16'; got {value!r}")


def check_supported(dtype: Optional[th.dtype], device: th.device) -> None:
    """Checks that ``device`` can run the reward net under autocast in ``dtype``.

    float16 needs CUDA (gradient scaling); bfloat16 on CUDA needs Ampere or later.

    Raises:
        ValueError: if the device cannot.
    """
    if dtype is None:
        return
    label = {th.bfloat16: "bfloat16", th.float16: "float16"}[dtype]
    if not th.amp.is_autocast_available(device.type):
        raise ValueError(
            f"autocast_dtype={label!r}: torch.autocast does not support "
            f"{device.type} devices"
        )
    if dtype == th.float16 and device.type != "cuda":
        raise ValueError(
            f"autocast_dtype='float16' needs a CUDA device (the reward net is on "
            f"{device}); use 'bfloat16' there"
        )
    cuda_bf16 = dtype == th.bfloat16 and device.type == "cuda"
    if cuda_bf16 and not th.cuda.is_bf16_supported():
        raise ValueError(
            f"autocast_dtype='bfloat16': {th.cuda.get_device_name(device)} does not "
            "support bfloat16; use 'float16'"
        )


def checkpointable_cnns(net: nn.Module) -> List[nn.Module]:
    """The CNN stacks of each ``CnnRewardNet`` and ``BasicPotentialCNN`` in ``net``."""
    stacks: List[nn.Module] = []
    for module in net.modules():
        if isinstance(module, reward_nets.CnnRewardNet):
            stacks.append(module.cnn)
        elif isinstance(module, reward_nets.BasicPotentialCNN):
            stacks.append(module._potential_net)
    return stacks


def check_checkpointable(net: nn.Module) -> None:
    """Checks that ``net`` has a CNN stack to checkpoint, free of norm layers.

    Raises:
        ValueError: if ``net`` holds no ``CnnRewardNet``/``BasicPotentialCNN``, or a
            stack holds a stateful norm layer (recomputation would update it twice).
    """
    stacks = checkpointable_cnns(net)
    if not stacks:
        raise ValueError(
            "activation_checkpointing=True needs a CnnRewardNet (or "
            f"BasicPotentialCNN) in the reward net; {type(net).__name__} has none"
        )
    for stack in stacks:
        for module in stack.modules():
            if isinstance(module, networks.BaseNorm):
                raise ValueError(
                    "activation_checkpointing=True: the CNN holds a "
                    f"{type(module).__name__}, whose statistics a recomputation "
                    "would update twice"
                )


@contextlib.contextmanager
def checkpointing(stacks: Sequence[nn.Module]) -> Iterator[None]:
    """Runs each stack under non-reentrant activation checkpointing.

    A stack called with gradient keeps only its input and recomputes the rest in
    the backward (with the same dropout masks).
    """
    with contextlib.ExitStack() as context:
        for stack in {id(stack): stack for stack in stacks}.values():

            def forward(x: th.Tensor, _original: Callable = stack.forward) -> th.Tensor:
                if not th.is_grad_enabled():
                    return _original(x)
                return torch_checkpoint.checkpoint(_original, x, use_reentrant=False)

            context.enter_context(_forward_replaced(stack, forward))
        yield


def _to_channels_last(module: nn.Module, args: Any) -> Any:
    x = args[0]
    if isinstance(x, th.Tensor) and x.dim() == 4:
        return (x.contiguous(memory_format=th.channels_last), *args[1:])
    return args


@contextlib.contextmanager
def channels_last(net: nn.Module) -> Iterator[None]:
    """Runs the convolution stacks of ``net`` in the ``channels_last`` format.

    Weights are converted in place (the optimizer keeps the same parameters) and
    back on exit; a pre-hook converts each stack's input.
    """
    stacks = checkpointable_cnns(net)
    handles = []
    for stack in stacks:
        stack.to(memory_format=th.channels_last)  # type: ignore[call-overload]
        handles.append(stack.register_forward_pre_hook(_to_channels_last))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for stack in stacks:
            stack.to(memory_format=th.contiguous_format)  # type: ignore[call-overload]


class StaticShapeForward:
    """Calls a compiled function with row counts it has already seen.

    A call of ``n`` rows runs padded with zero rows, whose outputs are cut off, to
    the smallest count seen that is at least ``n``; only a larger call compiles.

    Args:
        function: The compiled ``forward``; every argument holds one row per
            transition.
    """

    def __init__(self, function: Callable[..., th.Tensor]) -> None:
        self.function = function
        self.sizes: List[int] = []
        """The row counts called so far, in increasing order."""

    def __call__(self, *args: Any) -> th.Tensor:
        """The function's outputs for the rows of ``args`` (padded if need be)."""
        n = len(args[0])
        rows = next((size for size in self.sizes if size >= n), None)
        if rows is None:
            bisect.insort(self.sizes, n)
            rows = n
        if rows == n:
            return self.function(*args)
        padded = [
            th.cat([x, x.new_zeros((rows - n, *x.shape[1:]))])
            if isinstance(x, th.Tensor) and x.dim() > 0
            else x
            for x in args
        ]
        return self.function(*padded)[:n]


@contextlib.contextmanager
def _forward_replaced(module: nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """``module.forward`` is ``forward`` within the context, on the instance only."""
    own = vars(module).get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own
