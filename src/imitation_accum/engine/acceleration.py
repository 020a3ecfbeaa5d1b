"""Accelerator options of a trainer, in one argument: ``acceleration=``.

None of the options changes what a step computes beyond float round-off. All
are off by default but ``reuse_host_memory``:

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

import contextlib
import dataclasses
from typing import Any, Iterator, Mapping, Optional, Union

import torch as th
from torch import nn

from imitation_accum.engine import host_memory
from imitation_accum.nets import acceleration as net_acceleration

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
            net_acceleration.check_channels_last(net, f"{name}.channels_last")
        if self.compile:
            net_acceleration.check_compilable(net, f"{name}.compile")

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
                stack.enter_context(net_acceleration.channels_last(net))
            if self.compile:
                stack.enter_context(
                    net_acceleration.compiled_forward(net, self.compile_backend),
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
