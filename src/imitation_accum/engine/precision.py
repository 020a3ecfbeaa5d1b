"""Mixed precision for the reward-net forward: autocast dtypes and their checks.

``autocast_dtype="bfloat16"`` runs every reward-net call under ``torch.autocast``
in bfloat16 (CPUs and recent GPUs); ``"float16"`` does so in float16 on CUDA with a
``GradScaler``: each minibatch's loss is scaled before its backward, and the
gradients are unscaled, clipped and stepped once per batch, after which the scale
is updated. A step whose scaled gradients overflow is skipped (and reported).
Losses are always computed in float32 from the net's outputs.
"""

from typing import Optional

import torch as th

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
