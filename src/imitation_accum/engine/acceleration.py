"""How the reward net's forward runs: precision, checkpointing, accelerator options.

None of these settings changes what a step computes beyond round-off. Each is
checked before training, naming its argument, and holds only while a trainer trains
or a step's forward runs: the net is left as it was, so it saves and pickles as
before (imitation saves whole reward nets) and its state dict's values are unchanged.

**Mixed precision** (``autocast_dtype=``). ``"bfloat16"`` runs every reward-net
call under ``torch.autocast`` in bfloat16 (CPUs and recent GPUs); ``"float16"``
does so in float16 on CUDA with a ``GradScaler``: each minibatch's loss is scaled
before its backward, and the gradients are unscaled, clipped and stepped once per
batch, after which the scale is updated. A step whose scaled gradients overflow is
skipped (and reported). Losses are always computed in float32 from the net's
outputs.

**Activation checkpointing** (``activation_checkpointing=True``). The CNN stacks of
imitation's reward nets keep only their input for the backward and recompute their
activations there (:func:`checkpointing`).

**Accelerator options** (``acceleration=``, :class:`Acceleration`). All are off by
default but ``reuse_host_memory``:

- ``pinned_staging``: each chunk's frames go to the device through a page-locked
  host buffer, copied with ``non_blocking=True`` on a side CUDA stream while the
  previous chunk computes (see :mod:`imitation_accum.engine.staging`); frames stay
  ``uint8`` until the device. On a CPU it is a pass-through.
- ``channels_last``: the convolution stacks of the reward net run in the
  ``channels_last`` memory format (weights and inputs), which tensor-core
  convolutions prefer; the net is returned to its own format after training.
- ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark`` on while the trainer
  trains (restored afterwards): cuDNN times its algorithms once per input shape,
  which pays where chunk shapes repeat (fixed ``forward_size``, or ``compile``).
- ``compile``: the reward net's ``forward`` runs through ``torch.compile`` with
  static shapes; a call runs as the smallest row count already compiled that
  holds it (the last, ragged call of a batch as a full one), padded with rows
  whose outputs are dropped, so it neither recompiles nor weighs in the loss.
  Nets with ``RunningNorm``/``EMANorm`` layers are refused (padding rows would
  enter their statistics).
- ``reuse_host_memory`` (on): while a reward net on the CPU trains, freed
  activation memory stays in the process for the next chunk instead of going
  back to the kernel and faulting in again (glibc's ``malloc`` only; see
  :mod:`imitation_accum.engine.host_memory`); it goes back to the kernel
  after ``train`` returns.

Example:
    >>> from imitation_accum import Acceleration  # doctest: +SKIP
    >>> trainer = CrossEntropyRewardTrainer(  # doctest: +SKIP
    ...     preference_model, loss, rng,
    ...     acceleration=Acceleration(pinned_staging=True, channels_last=True),
    ... )
"""

import bisect
import contextlib
import dataclasses
from typing import (
    Any,
    Callable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

import torch as th
from imitation.rewards import reward_nets
from imitation.util import networks
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from imitation_accum.engine import host_memory

#: The values ``acceleration=`` accepts: options, a mapping of them (sacred), None.
AccelerationArg = Union["Acceleration", Mapping[str, Any], None]


@dataclasses.dataclass(frozen=True)
class Acceleration:
    """Accelerator options of a trainer; all off by default.

    Attributes:
        pinned_staging: Stage each chunk's inputs in page-locked memory and copy
            them on a side CUDA stream, the next chunk's during this one's compute.
        channels_last: Run the reward net's convolution stacks in the
            ``channels_last`` memory format.
        compile: Run the reward net's ``forward`` through ``torch.compile`` with
            static shapes (ragged calls padded with zero-weight rows).
        cudnn_benchmark: Turn on ``torch.backends.cudnn.benchmark`` while training.
        compile_backend: The ``torch.compile`` backend (``"inductor"``, PyTorch's
            default; ``"aot_eager"`` compiles nothing and is quick to set up).
        reuse_host_memory: While the reward net trains on the CPU, keep freed
            heap memory for the next chunk (returned after training).
    """

    pinned_staging: bool = False
    channels_last: bool = False
    compile: bool = False
    cudnn_benchmark: bool = False
    compile_backend: str = "inductor"
    reuse_host_memory: bool = True

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in (bool, "bool") and not isinstance(value, bool):
                raise ValueError(
                    f"acceleration.{field.name} must be True or False, got {value!r}",
                )
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise ValueError(
                "acceleration.compile_backend must be a torch.compile backend "
                f"name, got {self.compile_backend!r}",
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
        cls,
        value: AccelerationArg,
        name: str = "acceleration",
    ) -> "Acceleration":
        """Checks an ``acceleration`` argument.

        Args:
            value: ``None`` (all off), an :class:`Acceleration`, or a mapping of
                its fields (as a sacred config gives it).
            name: The argument's name, for error messages.

        Returns:
            The options.

        Raises:
            ValueError: for an unknown field or a value of the wrong type, naming
                it as ``<name>.<field>``.
        """
        if value is None:
            return cls()
        if isinstance(value, Acceleration):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{name} must be an Acceleration, a mapping of its fields or None, "
                f"got {type(value).__name__}",
            )
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"{name}.{unknown[0]} is not an acceleration option; the options "
                f"are {sorted(known)}",
            )
        try:
            return cls(**dict(value))
        except ValueError as error:
            raise ValueError(
                str(error).replace("acceleration.", f"{name}.", 1)
            ) from None

    def check_net(
        self,
        net: nn.Module,
        activation_checkpointing: bool = False,
        name: str = "acceleration",
    ) -> None:
        """Checks that the options suit ``net`` (before any training).

        Args:
            net: The reward net the trainer trains.
            activation_checkpointing: Whether the trainer checkpoints activations.
            name: The argument's name, for error messages.

        Raises:
            ValueError: if ``channels_last`` is asked for a net without a
                convolution stack, or ``compile`` for a net with norm layers or
                together with activation checkpointing.
        """
        if self.compile and activation_checkpointing:
            raise ValueError(
                f"{name}.compile=True and activation_checkpointing=True: choose one "
                "(the compiled forward would trace the checkpointed stacks)",
            )
        if self.channels_last:
            check_channels_last(net, f"{name}.channels_last")
        if self.compile:
            check_compilable(net, f"{name}.compile")

    @contextlib.contextmanager
    def applied(self, net: nn.Module) -> Iterator[None]:
        """Applies the net-side options to ``net`` while training it.

        ``channels_last``, ``compile`` and ``cudnn_benchmark`` hold inside the
        context and are undone on exit (so the net pickles and saves as before);
        so does ``reuse_host_memory`` for a net on the CPU; ``pinned_staging`` is
        the tasks' business (they read it).

        Args:
            net: The reward net whose ``forward`` the trainer calls.

        Yields:
            None.
        """
        with contextlib.ExitStack() as stack:
            if self.reuse_host_memory and _on_cpu(net):
                stack.enter_context(host_memory.kept_for_reuse())
            if self.cudnn_benchmark:
                stack.enter_context(cudnn_benchmark())
            if self.channels_last:
                stack.enter_context(channels_last(net))
            if self.compile:
                stack.enter_context(
                    compiled_forward(net, self.compile_backend),
                )
            yield


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool = True) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` set inside the context, restored after."""
    before = th.backends.cudnn.benchmark
    th.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        th.backends.cudnn.benchmark = before


def _on_cpu(net: nn.Module) -> bool:
    parameter = next(net.parameters(), None)
    return parameter is None or parameter.device.type == "cpu"


def maybe_applied(
    acceleration: Optional[Acceleration],
    net: nn.Module,
) -> contextlib.AbstractContextManager:
    """``acceleration.applied(net)``, or nothing when there is nothing to apply."""
    if acceleration is None:
        return contextlib.nullcontext()
    reuse = acceleration.reuse_host_memory and _on_cpu(net)
    if not (acceleration.any or reuse):
        return contextlib.nullcontext()
    return acceleration.applied(net)


DTYPES = {"bfloat16": th.bfloat16, "float16": th.float16}


def parse_autocast_dtype(
    value: object,
    name: str = "autocast_dtype",
) -> Optional[th.dtype]:
    """Checks an ``autocast_dtype`` argument.

    Args:
        value: ``None``, ``"bfloat16"`` or ``"float16"``.
        name: The argument's name, for error messages.

    Returns:
        The torch dtype, or ``None`` for full precision.

    Raises:
        ValueError: for any other value.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(
        f"{name} must be None, 'bfloat16' or 'float16'; got {value!r}",
    )


def check_supported(
    dtype: Optional[th.dtype],
    device: th.device,
    name: str = "autocast_dtype",
) -> None:
    """Checks that ``device`` can run the reward net under autocast in ``dtype``.

    float16 needs CUDA: its gradient scaling and fast kernels are CUDA's, and on a
    CPU bfloat16 has float32's range and needs no scaling. bfloat16 on CUDA needs a
    GPU that supports it (Ampere or later).

    Args:
        dtype: The autocast dtype, or ``None``.
        device: The reward net's device.
        name: The argument's name, for error messages.

    Raises:
        ValueError: if the device cannot.
    """
    if dtype is None:
        return
    label = {th.bfloat16: "bfloat16", th.float16: "float16"}[dtype]
    if not th.amp.is_autocast_available(device.type):
        raise ValueError(
            f"{name}={label!r}: torch.autocast does not support {device.type} devices",
        )
    if dtype == th.float16 and device.type != "cuda":
        raise ValueError(
            f"{name}='float16' needs a CUDA device (the reward net is on "
            f"{device}); use 'bfloat16' there",
        )
    cuda_bf16 = dtype == th.bfloat16 and device.type == "cuda"
    if cuda_bf16 and not th.cuda.is_bf16_supported():
        raise ValueError(
            f"{name}='bfloat16': {th.cuda.get_device_name(device)} does not "
            "support bfloat16; use 'float16'",
        )


def make_grad_scaler(
    dtype: Optional[th.dtype],
    device: th.device,
) -> Optional[th.amp.GradScaler]:
    """A ``GradScaler`` for float16, none otherwise."""
    if dtype != th.float16:
        return None
    return th.amp.GradScaler(device.type)


def checkpointable_cnns(net: nn.Module) -> List[nn.Module]:
    """The convolution stacks of imitation's CNN reward nets inside ``net``.

    Args:
        net: A reward net, possibly wrapped (normalized, shaped, ensembles).

    Returns:
        The ``cnn`` of every ``CnnRewardNet`` and the potential net of every
        ``BasicPotentialCNN`` in ``net``.
    """
    stacks: List[nn.Module] = []
    for module in net.modules():
        if isinstance(module, reward_nets.CnnRewardNet):
            stacks.append(module.cnn)
        elif isinstance(module, reward_nets.BasicPotentialCNN):
            stacks.append(module._potential_net)
    return stacks


def check_checkpointable(
    net: nn.Module,
    name: str = "activation_checkpointing",
) -> None:
    """Checks that ``net`` has a CNN stack to checkpoint, free of norm layers.

    Args:
        net: The reward net.
        name: The argument's name, for error messages.

    Raises:
        ValueError: if ``net`` holds no ``CnnRewardNet``/``BasicPotentialCNN``, or a
            stack holds a stateful norm layer (recomputation would update it twice).
    """
    stacks = checkpointable_cnns(net)
    if not stacks:
        raise ValueError(
            f"{name}=True needs a CnnRewardNet (or BasicPotentialCNN) in the reward "
            f"net; {type(net).__name__} has none",
        )
    for stack in stacks:
        for module in stack.modules():
            if isinstance(module, networks.BaseNorm):
                raise ValueError(
                    f"{name}=True: the CNN holds a {type(module).__name__}, whose "
                    "statistics a recomputation would update twice",
                )


@contextlib.contextmanager
def checkpointing(stacks: Sequence[nn.Module]) -> Iterator[None]:
    """Runs each stack under non-reentrant activation checkpointing.

    Within the context, a stack called with gradient enabled keeps only its input
    for the backward and recomputes its activations there (same dropout masks:
    the RNG state is replayed). The modules themselves are not changed: their
    ``forward`` is overridden on the instance and restored on exit, so state
    dicts and pickles are unaffected.

    Args:
        stacks: Modules to checkpoint (:func:`checkpointable_cnns`).

    Yields:
        None.
    """
    with contextlib.ExitStack() as context:
        for stack in {id(stack): stack for stack in stacks}.values():
            original = stack.forward

            def forward(
                x: th.Tensor,
                _original: Callable[[th.Tensor], th.Tensor] = original,
            ) -> th.Tensor:
                if not th.is_grad_enabled():
                    return _original(x)
                return torch_checkpoint.checkpoint(_original, x, use_reentrant=False)

            context.enter_context(_forward_replaced(stack, forward))
        yield


def check_channels_last(net: nn.Module, name: str) -> None:
    """Checks that ``net`` has a convolution stack to run in ``channels_last``.

    Args:
        net: The reward net.
        name: The option's name, for error messages.

    Raises:
        ValueError: if ``net`` holds no ``CnnRewardNet``/``BasicPotentialCNN``.
    """
    if not checkpointable_cnns(net):
        raise ValueError(
            f"{name}=True needs a convolutional reward net (a CnnRewardNet or "
            f"BasicPotentialCNN inside it); {type(net).__name__} has none",
        )


def check_compilable(net: nn.Module, name: str) -> None:
    """Checks that ``net`` may be compiled with padded, static-shape calls.

    Args:
        net: The reward net.
        name: The option's name, for error messages.

    Raises:
        ValueError: if ``net`` holds a ``RunningNorm``/``EMANorm`` layer, whose
            statistics the padding rows would enter.
    """
    for module in net.modules():
        if isinstance(module, networks.BaseNorm):
            raise ValueError(
                f"{name}=True: the reward net holds a {type(module).__name__}, whose "
                "statistics the rows that pad ragged calls to a static shape "
                "would enter; train it without compile",
            )


def _to_channels_last(
    module: nn.Module,
    args: Any,
) -> Any:
    x = args[0]
    if isinstance(x, th.Tensor) and x.dim() == 4:
        return (x.contiguous(memory_format=th.channels_last), *args[1:])
    return args


@contextlib.contextmanager
def channels_last(net: nn.Module) -> Iterator[None]:
    """Runs the convolution stacks of ``net`` in the ``channels_last`` format.

    Their 4-d weights are converted in place (the parameters stay the same
    objects, so the optimizer keeps them), and a pre-hook hands each stack its
    input in ``channels_last`` (free for frames that arrive height-width-channels,
    which imitation's ``CnnRewardNet`` permutes into exactly that layout). On exit
    the hooks go and the weights return to the contiguous format.

    Args:
        net: The reward net.

    Yields:
        None.
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


def _padded(tensor: Any, rows: int) -> Any:
    if not isinstance(tensor, th.Tensor) or tensor.dim() == 0:
        return tensor
    missing = rows - len(tensor)
    return th.cat([tensor, tensor.new_zeros((missing, *tensor.shape[1:]))])


class StaticShapeForward:
    """Calls a compiled function with row counts it has already seen.

    A call of ``n`` rows runs as the smallest row count seen so far that is at
    least ``n``, padded with zero rows whose outputs are cut off before they are
    returned (so they get no weight in any loss and no gradient flows from them);
    only a call larger than every earlier one brings a new shape. Calls of a step
    come in a few sizes (``forward_size``, then the last, ragged call): the ragged
    call never compiles a shape of its own.

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
        return self.function(*(_padded(arg, rows) for arg in args))[:n]


@contextlib.contextmanager
def compiled_forward(net: nn.Module, backend: str = "inductor") -> Iterator[None]:
    """Runs ``net.forward`` through ``torch.compile`` with static shapes.

    The instance's ``forward`` is overridden for the time of the context (calls
    through ``net(...)`` and wrappers such as DDP see it) and restored on exit.

    Args:
        net: The reward net.
        backend: The ``torch.compile`` backend.

    Yields:
        None.
    """
    compiled = th.compile(net.forward, dynamic=False, backend=backend)
    with _forward_replaced(net, StaticShapeForward(compiled)):
        yield


@contextlib.contextmanager
def _forward_replaced(module: nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """``module.forward`` is ``forward`` within the context, on the instance only.

    The class, the state dict and pickles are untouched; the instance's own
    ``forward``, if it had one, comes back on exit.
    """
    own = vars(module).get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own
