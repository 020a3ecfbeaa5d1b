"""Out-of-memory back-off: halve the chunk and redo the step."""

import torch as th


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is PyTorch's out-of-memory error (of any accelerator)."""
    return isinstance(error, th.OutOfMemoryError)


def release_cached_memory(device: th.device) -> None:
    """Returns the caching allocator's unused blocks, after an out-of-memory error."""
    if device.type == "cuda":
        th.cuda.empty_cache()


def halved_chunk(
    transitions: int,
    error: BaseException,
    unit: str = "transition",
) -> int:
    """The chunk size to retry with after an out-of-memory error.

    Args:
        transitions: Transitions (or other units) of the largest chunk of the
            failed step.
        error: The out-of-memory error.
        unit: What ``transitions`` counts, for the message.

    Returns:
        Half of ``transitions`` (at least one).

    Raises:
        torch.OutOfMemoryError: if the failed chunk held a single unit.
    """
    if transitions <= 1:
        raise th.OutOfMemoryError(
            f"out of memory with chunks of one {unit}: the reward net does not "
            f"fit on its device for a single {unit} (plus parameters, "
            "gradients and optimizer state). Use a smaller net, "
            "activation_checkpointing=True, autocast_dtype, or a larger device. "
            f"The error was: {error}",
        ) from error
    return transitions // 2
