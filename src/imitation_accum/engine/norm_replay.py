"""Once-per-step statistics for imitation's stateful input normalization layers.

The exactness reference is one training-mode forward of the reward net over every
transition of the batch. In that forward each call of a ``RunningNorm`` or
``EMANorm`` layer first updates the layer's statistics from everything the call
sees, then normalizes with the updated statistics; a layer may be called more than
once per forward (a shaped reward net calls its potential on ``next_state``, then
on ``state``).

When the batch is split into several reward-net calls, :class:`NormReplay`
reproduces that forward exactly:

1. a no-grad pre-pass over every chunk gathers, per call of each layer, the moments
   (count, mean, M2) of the call's inputs (:meth:`NormReplay.gathering`);
2. the layer's own update rule is replayed call by call on those moments
   (:meth:`NormReplay.replay`);
3. every chunk then runs with each call normalized by its replayed statistics and
   no statistics updates (:meth:`NormReplay.replaying`);
4. the buffers are left where the reference leaves them (:meth:`NormReplay.commit`).

Layers whose input depends on another norm layer's output are handled by repeating
the pre-pass until the moments stop changing. Layers that couple the items of a batch
(``nn.BatchNorm*``) cannot be accumulated exactly and are rejected.
"""

import contextlib
import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch as th
from imitation.util import networks
from torch import nn

SUPPORTED_NORMS = (networks.RunningNorm, networks.EMANorm)


def check_accumulable(net: nn.Module, argument: str = "reward net") -> None:
    """Rejects layers whose training-mode output depends on the batch split.

    Args:
        net: The network to check.
        argument: How the network is named in error messages.

    Raises:
        ValueError: if ``net`` contains a batch-norm layer, or a subclass of
            imitation's ``BaseNorm`` whose update rule cannot be replayed.
    """
    for name, module in net.named_modules():
        where = f"{argument} module '{name or '<root>'}' ({type(module).__name__})"
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"{where} normalizes with the statistics of the current batch, so "
                "splitting the batch into minibatches changes its output: gradient "
                "accumulation cannot be exact. Use imitation's RunningNorm or "
                "EMANorm, or a per-sample norm such as nn.LayerNorm.",
            )
        if isinstance(module, networks.BaseNorm) and not isinstance(
            module,
            SUPPORTED_NORMS,
        ):
            raise ValueError(
                f"{where} is a BaseNorm whose statistics update cannot be replayed "
                "once per step; supported: RunningNorm, EMANorm.",
            )


@dataclasses.dataclass
class Moments:
    """Count, mean and sum of squared deviations of a set of feature vectors."""

    count: int
    mean: th.Tensor
    m2: th.Tensor

    @classmethod
    def of(cls, batch: th.Tensor) -> "Moments":
        """Moments of ``batch`` along its first dimension, in float64."""
        values = batch.detach().to(th.float64)
        if values.ndim == 1:
            values = values.reshape(-1, 1)
        mean = values.mean(0)
        return cls(len(values), mean, th.square(values - mean).sum(0))

    def merge(self, other: "Moments") -> "Moments":
        """Moments of the union of both sets (Chan et al.'s pairwise update)."""
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + th.square(delta) * (self.count * other.count / count)
        return Moments(count, mean, m2)

    @property
    def var(self) -> th.Tensor:
        """Biased variance, as the norm layers use it."""
        return self.m2 / self.count


#: Per layer, per call: the moments of that call's inputs over the whole batch.
CallMoments = List[List[Moments]]
#: Per layer, per call: the (mean, var) the call normalizes with.
CallStats = List[List[Tuple[th.Tensor, th.Tensor]]]


@dataclasses.dataclass
class ReplayedStatistics:
    """Result of replaying the update rules over one step's moments."""

    per_call: CallStats
    final_buffers: List[Dict[str, th.Tensor]]


def _replay_running_norm(state: Dict[str, th.Tensor], moments: Moments) -> None:
    # Same arithmetic as RunningNorm.update_stats, fed with moments instead of a
    # batch (update_stats only accepts the batch itself).
    batch_mean = moments.mean.to(state["running_mean"].dtype)
    batch_var = moments.var.to(state["running_var"].dtype)
    batch_count = moments.count
    delta = batch_mean - state["running_mean"]
    tot_count = state["count"] + batch_count
    state["running_mean"] += delta * batch_count / tot_count
    state["running_var"] *= state["count"]
    state["running_var"] += batch_var * batch_count
    state["running_var"] += th.square(delta) * state["count"] * batch_count / tot_count
    state["running_var"] /= tot_count
    state["count"] += batch_count


def _replay_ema_norm(
    layer: networks.EMANorm,
    state: Dict[str, th.Tensor],
    moments: Moments,
) -> None:
    # Same arithmetic as EMANorm.update_stats (Algorithm 3 of imitation's note),
    # fed with moments instead of a batch.
    state["inv_learning_rate"] += layer.decay ** state["num_batches"]
    learning_rate = 1 / state["inv_learning_rate"]
    delta_mean = moments.mean.to(state["running_mean"].dtype) - state["running_mean"]
    state["running_mean"] += learning_rate * delta_mean
    batch_var = moments.var.to(state["running_var"].dtype)
    delta_var = batch_var + (1 - learning_rate) * delta_mean**2 - state["running_var"]
    state["running_var"] += learning_rate * delta_var
    state["count"] += moments.count
    state["num_batches"] += 1


class NormReplay:
    """Reproduces one full-batch training forward's norm statistics across chunks.

    Args:
        net: The reward net that each reward-net call invokes (the root module).
            All ``RunningNorm``/``EMANorm`` layers inside it are handled.

    Raises:
        ValueError: if ``net`` contains a layer that cannot be accumulated exactly
            (see :func:`check_accumulable`).
    """

    def __init__(self, net: nn.Module) -> None:
        check_accumulable(net)
        self.net = net
        self.layers: List[networks.BaseNorm] = [
            m for m in net.modules() if isinstance(m, SUPPORTED_NORMS)
        ]
        self._calls: List[int] = [0] * len(self.layers)
        # Whether some layer's input depends on another layer's output; learnt on
        # the first step (None until then).
        self.chained: Optional[bool] = None

    @property
    def active(self) -> bool:
        """Whether the net has any stateful norm layer."""
        return bool(self.layers)

    def _reset_calls(self, *_: object) -> None:
        self._calls = [0] * len(self.layers)

    def _next_call(self, index: int) -> int:
        call = self._calls[index]
        self._calls[index] += 1
        return call

    @contextlib.contextmanager
    def _overriding(self, make_forward) -> Iterator[None]:
        hook = self.net.register_forward_pre_hook(self._reset_calls)
        for index, layer in enumerate(self.layers):
            layer.forward = make_forward(index, layer)  # type: ignore[method-assign]
        try:
            yield
        finally:
            hook.remove()
            for layer in self.layers:
                del layer.forward

    @contextlib.contextmanager
    def gathering(
        self,
        provisional: Optional[CallStats] = None,
    ) -> Iterator[CallMoments]:
        """Records, per layer and call, the moments of the inputs of every net call.

        Within the context each call normalizes with ``provisional`` statistics
        (the layer's current buffers if ``None``) and updates nothing.

        Args:
            provisional: Statistics to normalize with, as from :meth:`replay`.

        Yields:
            The moments gathered so far; complete once the context exits.
        """
        gathered: CallMoments = [[] for _ in self.layers]

        def make_forward(index: int, layer: networks.BaseNorm):
            def forward(x: th.Tensor) -> th.Tensor:
                call = self._next_call(index)
                calls = gathered[index]
                if call < len(calls):
                    calls[call] = calls[call].merge(Moments.of(x))
                elif call == len(calls):
                    calls.append(Moments.of(x))
                else:  # pragma: no cover - calls are numbered consecutively
                    raise AssertionError("norm calls out of order")
                if provisional is not None and call < len(provisional[index]):
                    mean, var = provisional[index][call]
                else:
                    mean, var = layer.running_mean, layer.running_var
                return (x - mean) / th.sqrt(var + layer.eps)

            return forward

        with self._overriding(make_forward):
            yield gathered

    def replay(self, moments: CallMoments) -> ReplayedStatistics:
        """Replays each layer's update rule call by call over the gathered moments.

        Args:
            moments: Per layer, per call, the moments over the whole batch.

        Returns:
            The statistics each call normalizes with, and the final buffers.
        """
        per_call: CallStats = []
        final: List[Dict[str, th.Tensor]] = []
        for layer, calls in zip(self.layers, moments):
            state = {name: buf.clone() for name, buf in layer.named_buffers()}
            stats = []
            for call_moments in calls:
                if isinstance(layer, networks.EMANorm):
                    _replay_ema_norm(layer, state, call_moments)
                else:
                    _replay_running_norm(state, call_moments)
                stats.append(
                    (state["running_mean"].clone(), state["running_var"].clone()),
                )
            per_call.append(stats)
            final.append(state)
        return ReplayedStatistics(per_call, final)

    @contextlib.contextmanager
    def replaying(self, stats: ReplayedStatistics) -> Iterator[None]:
        """Normalizes call ``k`` of each layer with its replayed statistics.

        Args:
            stats: The result of :meth:`replay`.

        Yields:
            None; statistics are not updated within the context.
        """

        def make_forward(index: int, layer: networks.BaseNorm):
            calls = stats.per_call[index]

            def forward(x: th.Tensor) -> th.Tensor:
                call = self._next_call(index)
                if call >= len(calls):
                    raise RuntimeError(
                        f"norm layer {type(layer).__name__} was called {call + 1} "
                        f"times in one reward-net call, but only {len(calls)} "
                        "times per call in the statistics pre-pass",
                    )
                mean, var = calls[call]
                return (x - mean) / th.sqrt(var + layer.eps)

            return forward

        with self._overriding(make_forward):
            yield

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Normalizes with the current buffers and updates nothing."""
        modes = [layer.training for layer in self.layers]
        for layer in self.layers:
            layer.train(False)
        try:
            yield
        finally:
            for layer, mode in zip(self.layers, modes):
                layer.train(mode)

    def commit(self, stats: ReplayedStatistics) -> None:
        """Writes the final replayed statistics into the layers' buffers."""
        self._write(stats.final_buffers)

    def snapshot(self) -> List[Dict[str, th.Tensor]]:
        """Copies of every layer's buffers, for :meth:`restore`."""
        return [
            {name: buf.detach().clone() for name, buf in layer.named_buffers()}
            for layer in self.layers
        ]

    def restore(self, snapshot: Sequence[Dict[str, th.Tensor]]) -> None:
        """Puts back buffers saved by :meth:`snapshot`."""
        self._write(snapshot)

    def _write(self, buffers: Sequence[Dict[str, th.Tensor]]) -> None:
        """Copies ``buffers`` (per layer, by name) into the layers' buffers."""
        with th.no_grad():
            for layer, state in zip(self.layers, buffers):
                for name, buf in layer.named_buffers():
                    buf.copy_(state[name])


def moments_equal(a: CallMoments, b: CallMoments) -> bool:
    """Whether two gathered moment sets are identical, call by call."""
    if [len(calls) for calls in a] != [len(calls) for calls in b]:
        return False
    return all(
        x.count == y.count and th.equal(x.mean, y.mean) and th.equal(x.m2, y.m2)
        for calls_a, calls_b in zip(a, b)
        for x, y in zip(calls_a, calls_b)
    )


def settled_statistics(
    norms: NormReplay,
    gather: Callable[[Optional[CallStats]], CallMoments],
) -> ReplayedStatistics:
    """Statistics from no-grad pre-passes, repeated until they settle.

    A layer whose input depends on another norm layer's output needs the
    pre-pass repeated until the gathered moments stop changing; whether the net
    is like that is learnt on the first step by running a second pass
    (``norms.chained``).

    Args:
        norms: The net's norm layers.
        gather: Runs one pre-pass, normalizing with the given provisional
            per-call statistics (``None`` at first), and returns the moments
            every norm call saw.

    Returns:
        The replayed statistics.

    Raises:
        RuntimeError: if the moments do not settle.
    """
    provisional = None
    previous: Optional[CallMoments] = None
    passes = 0
    while True:
        moments = gather(provisional)
        stats = norms.replay(moments)
        passes += 1
        if norms.chained is False:
            return stats
        if previous is not None and moments_equal(previous, moments):
            if norms.chained is None:
                norms.chained = passes > 2
            return stats
        if passes > 1 + sum(len(calls) for calls in moments):
            raise RuntimeError(
                "norm layer statistics did not settle: the inputs of the norm "
                "layers keep changing between identical pre-passes",
            )
        previous, provisional = moments, stats.per_call
