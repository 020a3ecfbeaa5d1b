"""Once-per-step statistics for imitation's ``RunningNorm``/``EMANorm`` layers.

A no-grad pre-pass gathers each call's input moments, the layer's update rule is
replayed on them, and the chunks run with the replayed statistics.
"""

import contextlib
import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch as th
from imitation.util import networks
from torch import nn

SUPPORTED_NORMS = (networks.RunningNorm, networks.EMANorm)


def check_accumulable(net: nn.Module) -> None:
    """Rejects layers of ``net`` whose training-mode output depends on the batch split.

    Raises:
        ValueError: for a batch norm or a ``BaseNorm`` that cannot be replayed.
    """
    for name, module in net.named_modules():
        where = f"reward net module '{name or '<root>'}' ({type(module).__name__})"
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"{where} normalizes with the statistics of the current batch, so "
                "splitting the batch into minibatches changes its output: gradient "
                "accumulation cannot be exact. Use imitation's RunningNorm or "
                "EMANorm, or a per-sample norm such as nn.LayerNorm."
            )
        if isinstance(module, networks.BaseNorm) and not isinstance(
            module, SUPPORTED_NORMS
        ):
            raise ValueError(
                f"{where} is a BaseNorm whose statistics update cannot be replayed "
                "once per step; supported: RunningNorm, EMANorm."
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

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Moments)
            and self.count == other.count
            and th.equal(self.mean, other.mean)
            and th.equal(self.m2, other.m2)
        )


#: Per layer, per call: the moments of that call's inputs over the whole batch.
CallMoments = List[List[Moments]]
#: The (mean, var) a norm call normalizes with.
Stats = Tuple[th.Tensor, th.Tensor]
#: Per layer, per call: the statistics the call normalizes with.
CallStats = List[List[Stats]]


@dataclasses.dataclass
class ReplayedStatistics:
    """Result of replaying the update rules over one step's moments."""

    per_call: CallStats
    final_buffers: List[Dict[str, th.Tensor]]


def _replay(layer: networks.BaseNorm, state: Dict[str, th.Tensor], m: Moments) -> None:
    # The arithmetic of RunningNorm/EMANorm.update_stats, fed with moments.
    mean = m.mean.to(state["running_mean"].dtype)
    var = (m.m2 / m.count).to(state["running_var"].dtype)  # biased, as the layers
    delta = mean - state["running_mean"]
    if isinstance(layer, networks.EMANorm):
        state["inv_learning_rate"] += layer.decay ** state["num_batches"]
        rate = 1 / state["inv_learning_rate"]
        state["running_mean"] += rate * delta
        state["running_var"] += rate * (
            var + (1 - rate) * delta**2 - state["running_var"]
        )
        state["num_batches"] += 1
    else:
        total = state["count"] + m.count
        state["running_mean"] += delta * m.count / total
        state["running_var"] *= state["count"]
        state["running_var"] += var * m.count
        state["running_var"] += th.square(delta) * state["count"] * m.count / total
        state["running_var"] /= total
    state["count"] += m.count


class NormReplay:
    """Reproduces one full-batch forward's norm statistics across ``net``'s chunks.

    Raises:
        ValueError: if ``net`` contains a layer that cannot be accumulated exactly.
    """

    def __init__(self, net: nn.Module) -> None:
        check_accumulable(net)
        self.net = net
        self.layers: List[networks.BaseNorm] = [
            m for m in net.modules() if isinstance(m, SUPPORTED_NORMS)
        ]
        self._calls = [0] * len(self.layers)
        self.chained: Optional[bool] = None
        """Whether a layer's input depends on another's output (learnt on step 1)."""

    @property
    def active(self) -> bool:
        """Whether the net has any stateful norm layer."""
        return bool(self.layers)

    @contextlib.contextmanager
    def _overriding(
        self, stats_of: Callable[[int, int, th.Tensor], Stats]
    ) -> Iterator[None]:
        """Call ``k`` of layer ``i`` (per net call) uses ``stats_of(i, k, x)``."""

        def reset_calls(*_: object) -> None:
            self._calls = [0] * len(self.layers)

        def make_forward(index: int) -> Callable[[th.Tensor], th.Tensor]:
            def forward(x: th.Tensor) -> th.Tensor:
                self._calls[index] += 1
                mean, var = stats_of(index, self._calls[index] - 1, x)
                return (x - mean) / th.sqrt(var + self.layers[index].eps)

            return forward

        hook = self.net.register_forward_pre_hook(reset_calls)
        for index, layer in enumerate(self.layers):
            layer.forward = make_forward(index)  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            hook.remove()
            for layer in self.layers:
                del layer.forward

    @contextlib.contextmanager
    def gathering(
        self, provisional: Optional[CallStats] = None
    ) -> Iterator[CallMoments]:
        """Records each layer's input moments per call; normalizes with ``provisional``.

        Yields:
            The moments, complete once the context exits.
        """
        gathered: CallMoments = [[] for _ in self.layers]

        def stats_of(index: int, call: int, x: th.Tensor) -> Stats:
            calls = gathered[index]
            if call < len(calls):
                calls[call] = calls[call].merge(Moments.of(x))
            else:
                calls.append(Moments.of(x))
            if provisional is not None and call < len(provisional[index]):
                return provisional[index][call]
            return self.layers[index].running_mean, self.layers[index].running_var

        with self._overriding(stats_of):
            yield gathered

    def replay(self, moments: CallMoments) -> ReplayedStatistics:
        """Replays each layer's update rule call by call over the batch's moments."""
        per_call: CallStats = []
        final = self.snapshot()
        for layer, calls, state in zip(self.layers, moments, final):
            stats = []
            for call_moments in calls:
                _replay(layer, state, call_moments)
                stats.append(
                    (state["running_mean"].clone(), state["running_var"].clone())
                )
            per_call.append(stats)
        return ReplayedStatistics(per_call, final)

    @contextlib.contextmanager
    def replaying(self, stats: ReplayedStatistics) -> Iterator[None]:
        """Normalizes call ``k`` of each layer with its ``stats``; updates nothing."""

        def stats_of(index: int, call: int, x: th.Tensor) -> Stats:
            calls = stats.per_call[index]
            if call >= len(calls):
                raise RuntimeError(
                    f"norm layer {type(self.layers[index]).__name__} was called "
                    f"{call + 1} times in one reward-net call, but only {len(calls)} "
                    "times per call in the statistics pre-pass"
                )
            return calls[call]

        with self._overriding(stats_of):
            yield

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Normalizes with the current buffers and updates nothing."""
        with contextlib.ExitStack() as stack:
            for layer in self.layers:
                stack.enter_context(networks.evaluating(layer))
            yield

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
        with th.no_grad():
            for layer, state in zip(self.layers, buffers):
                for name, buf in layer.named_buffers():
                    buf.copy_(state[name])


def settled_statistics(
    norms: NormReplay, gather: Callable[[Optional[CallStats]], CallMoments]
) -> ReplayedStatistics:
    """Statistics from no-grad pre-passes, repeated until the moments settle.

    Chained norm layers need repeats; the first step learns ``norms.chained``.
    ``gather(provisional)`` runs one pre-pass with the provisional statistics.

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
        if previous == moments:
            if norms.chained is None:
                norms.chained = passes > 2
            return stats
        if passes > 1 + sum(len(calls) for calls in moments):
            raise RuntimeError(
                "norm layer statistics did not settle: the inputs of the norm "
                "layers keep changing between identical pre-passes"
            )
        previous, provisional = moments, stats.per_call
