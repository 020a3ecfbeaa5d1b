"""What happens to the gradient once per step: regularizer, norm, clipping."""

from typing import Optional, Sequence

import torch as th
from imitation.regularization import regularizers


def total_norm(params: Sequence[th.Tensor]) -> th.Tensor:
    """The total 2-norm of the gradients of ``params`` (zero without any)."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return th.zeros(())
    total_norm = getattr(th.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if total_norm is not None:
        return total_norm(grads)
    return th.linalg.vector_norm(th.stack([th.linalg.vector_norm(g) for g in grads]))


def regularize(
    regularizer: regularizers.Regularizer,
    params: Sequence[th.Tensor],
    mean_loss: float,
    device: th.device,
) -> None:
    """Applies an imitation regularizer once, to the batch's mean loss.

    A leaf stands for the batch loss: loss regularizers add their penalty to it
    and backpropagate once; weight regularizers call backward on it (a no-op for
    the parameters) and decay the weights in place, which a failure undoes.

    Args:
        regularizer: The regularizer.
        params: The parameters it acts on.
        mean_loss: The batch's mean loss.
        device: The parameters' device.
    """
    saved = None
    if not isinstance(regularizer, regularizers.LossRegularizer):
        saved = [p.detach().clone() for p in params]
    try:
        batch_loss = th.tensor(mean_loss, device=device, requires_grad=True)
        regularizer.regularize_and_backward(batch_loss)
    except BaseException:
        if saved is not None:
            with th.no_grad():
                for p, old in zip(params, saved):
                    p.copy_(old)
        raise


def clip_and_measure(
    params: Sequence[th.Tensor],
    max_grad_norm: Optional[float],
) -> float:
    """The total gradient norm before clipping; clips to ``max_grad_norm`` if given."""
    if max_grad_norm is not None:
        grads = [p for p in params if p.grad is not None]
        if not grads:
            return 0.0
        return float(th.nn.utils.clip_grad_norm_(grads, max_grad_norm))
    return float(total_norm(params))
