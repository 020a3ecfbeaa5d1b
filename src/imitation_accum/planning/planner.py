"""The planner: one object per trainer that decides every step's plan.

Given the lengths of a batch's items, ``minibatch_size``, the memory cap (from a
``memory_budget``, lowered after an out-of-memory error), ``forward_size`` and a
:class:`Workload` it may run to measure, :meth:`Planner.plan` returns the
immutable :class:`~imitation_accum.planning.plan.StepPlan` of a training step and
:meth:`Planner.plan_evaluation` that of a no-grad evaluation. Every trainer of the
package (preference, single process and DDP; AIRL/GAIL; validation; evaluation)
plans with it, and :meth:`Planner.run` is the one out-of-memory retry: roll back
(the engine does), halve, redo.

Two passes are chosen when one item alone exceeds the memory cap, when asked for
(``two_pass=True``), or when measured faster: when calls are smaller than a chunk,
one pass keeps the graphs of all of a chunk's calls alive until its backward,
while two passes free each call's graph at once at the price of one more forward
without gradient. With ``forward_size="auto"`` the planner times both on the first
chunk of the first batch, chooses the faster and logs the choice; what it times
(call sizes, passes, threads) is its
:class:`~imitation_accum.planning.call_tuning.CallTuning`.
"""

import time
from typing import (
    Callable,
    Hashable,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

import numpy as np
import torch as th

from imitation_accum.planning import budget, cpu_load, oom, probe
from imitation_accum.planning.call_tuning import CallTuning
from imitation_accum.planning.forward_size import (
    ForwardSizes,
    TuningResult,
)
from imitation_accum.planning.plan import StepPlan, as_sides, pair_chunks
from imitation_accum.planning.workload import (
    Workload,
)

ResultT = TypeVar("ResultT")


def _no_log(message: str) -> None:
    del message


class Planner:
    """Decides each step's chunks, reward-net call size and pass count.

    Args:
        minibatch_size: Items per one-pass chunk, or ``None``.
        forward_size: Transitions per reward-net call, ``"auto"`` to measure, or
            ``None`` for one call per chunk.
        two_pass: ``None`` to decide (memory, then speed), or pinned.
        log: Where the planner's decisions are written.
        forward_sizes: The cache of tuned sizes (shared by ensemble members).
        unit: What an item's length counts: transitions (a fragment pair holds
            many), or for the discriminator rows of an expert and a generator
            transition; chunk caps count the same unit.
    """

    def __init__(
        self,
        *,
        minibatch_size: Optional[int],
        forward_size: Union[int, str, None] = "auto",
        two_pass: Optional[bool] = None,
        log: Callable[[str], None] = _no_log,
        forward_sizes: Optional[ForwardSizes] = None,
        unit: str = "transition",
    ) -> None:
        self.minibatch_size = minibatch_size
        self.unit = unit
        self.forward_size = forward_size
        self.two_pass = two_pass
        self.log = log
        self.tuning = CallTuning(
            forward_sizes or ForwardSizes(),
            log=lambda message: self.log(message),
        )
        """What ``forward_size="auto"`` timed: call sizes, passes, threads."""
        self.budget_cap: Optional[int] = None
        """Units per chunk that fit the memory budget."""
        self.backed_off_cap: Optional[int] = None
        """Units per chunk left by out-of-memory back-offs."""
        self.profile: Optional[probe.ActivationProfile] = None
        self.profile_key: Optional[Hashable] = None

    @property
    def forward_sizes(self) -> ForwardSizes:
        """The tuned call sizes (shared by ensemble members)."""
        return self.tuning.forward_sizes

    @forward_sizes.setter
    def forward_sizes(self, sizes: ForwardSizes) -> None:
        self.tuning.forward_sizes = sizes

    @property
    def tuning_seconds(self) -> float:
        """Wall-clock seconds spent timing calls (forward size, passes)."""
        return self.tuning.seconds

    @property
    def chunk_cap(self) -> Optional[int]:
        """Units per chunk that fit in memory, or ``None``: not limited."""
        caps = [c for c in (self.budget_cap, self.backed_off_cap) if c is not None]
        return min(caps) if caps else None

    def call_size(self, limit: int, workload: Optional[Workload]) -> int:
        """Transitions per reward-net call for calls of at most ``limit``.

        Args:
            limit: Transitions of the chunk the calls cover.
            workload: Timed on the first request when ``forward_size="auto"``.

        Returns:
            The call size, at most ``limit`` and at most the memory cap.
        """
        cap = self.chunk_cap
        limit = max(1, limit if cap is None else min(limit, cap))
        if self.forward_size is None:
            return limit
        if self.forward_size != "auto":
            return min(int(self.forward_size), limit)
        if workload is None:
            raise ValueError("forward_size='auto' needs a workload to time")
        return self.tuning.call_size(workload, limit)

    def threads(self, workload: Optional[Workload]) -> Optional[int]:
        """Intra-op threads the workload's calls were tuned to (``None``: as set)."""
        if workload is None or self.forward_size != "auto":
            return None
        return self.tuning.threads(workload)

    def _thread_trial(self, workload: Optional[Workload]) -> Optional[TuningResult]:
        """The tuning whose thread count is still being tried on steps, if any."""
        if workload is None or self.forward_size != "auto":
            return None
        return self.tuning.trial(workload)

    def plan(
        self,
        item_transitions: np.ndarray,
        workload: Optional[Workload] = None,
    ) -> StepPlan:
        """The plan of a training step whose items hold ``item_transitions``.

        Args:
            item_transitions: Transitions per item of (this process's share of)
                the batch, ``(n_items,)``, or per side ``(n_items, n_sides)``
                for items whose sides are laid out mirrored (fragment pairs).
            workload: What timing and tuning may run (first use only).

        Returns:
            The plan.

        Raises:
            ValueError: if ``two_pass=False`` is pinned but one item exceeds the
                memory cap.
        """
        sides = as_sides(item_transitions)
        if not len(sides):
            return StepPlan.one_pass(sides, [], 1, "no items")
        lengths = sides.sum(1)
        cap = self.chunk_cap
        fits = cap is None or int(lengths.max()) <= cap
        if not fits and self.two_pass is False:
            raise ValueError(
                f"two_pass=False, but an item of {int(lengths.max())} {self.unit}s "
                f"exceeds the {cap} {self.unit}s that fit in memory_budget (or the "
                "device, after an out-of-memory error); allow two passes "
                "(two_pass=None) or raise the budget",
            )
        chunks = self._item_chunks(lengths) if fits else []
        first = int(lengths[chunks[0]].sum()) if fits else int(cap or 1)
        size = self.call_size(first, workload)
        if self.two_pass is True:
            two_pass, reason = True, "two_pass=True"
        elif not fits:
            two_pass, reason = True, "one item exceeds the memory cap"
        elif (
            self.two_pass is None
            and self.forward_size == "auto"
            and size < first
            and workload is not None
        ):
            two_pass, reason = self.tuning.faster_mode(workload, first, size)
        else:
            two_pass, reason = False, "calls span whole chunks"
        if two_pass:
            return StepPlan.two_passes(sides, size, reason)
        return StepPlan.one_pass(sides, chunks, size, reason)

    def plan_evaluation(
        self,
        item_transitions: np.ndarray,
        workload: Optional[Workload] = None,
    ) -> StepPlan:
        """The plan of a no-grad evaluation: chunks of whole items, one pass.

        Without gradient no graph is kept, so an item larger than the memory cap
        needs no second pass: its calls are at most the cap.

        Args:
            item_transitions: Transitions per item.
            workload: What tuning may run (first use only).

        Returns:
            The plan.
        """
        sides = as_sides(item_transitions)
        if not len(sides):
            return StepPlan.one_pass(sides, [], 1, "no items")
        chunks = self._item_chunks(sides.sum(1))
        size = self.call_size(int(sides[chunks[0]].sum()), workload)
        return StepPlan.one_pass(sides, chunks, size, "evaluation")

    def _item_chunks(self, lengths: np.ndarray) -> list:
        return pair_chunks(
            lengths,
            max_items=self.minibatch_size,
            max_transitions=self.chunk_cap,
        )

    def run(
        self,
        item_transitions: np.ndarray,
        step: Callable[[StepPlan], ResultT],
        workload: Optional[Workload] = None,
        *,
        device: th.device,
        evaluation: bool = False,
    ) -> Tuple[StepPlan, ResultT]:
        """Plans and runs a step; after out-of-memory, halves the chunk and redoes it.

        ``step`` must leave no trace when it raises (the engine rolls back).

        Args:
            item_transitions: Transitions per item of the batch.
            step: Builds the plan's chunks and runs them.
            workload: What timing and tuning may run.
            device: Whose cached memory to release before a retry.
            evaluation: Plan a no-grad evaluation instead of a training step.

        Returns:
            The plan that ran and what ``step`` returned.

        Raises:
            torch.OutOfMemoryError: if chunks of one transition do not fit.
        """
        plan_of = self.plan_evaluation if evaluation else self.plan
        while True:
            plan = plan_of(item_transitions, workload)
            try:
                trial = self._thread_trial(workload)
                threads = (
                    self.threads(workload)
                    if trial is None
                    else self.tuning.thread_trial.next_threads(trial)
                )
                with cpu_load.intra_op_threads(threads):
                    begin = time.perf_counter()
                    result = step(plan)
                if trial is not None:
                    seconds = time.perf_counter() - begin
                    transitions = sum(plan.chunk_transitions)
                    self.tuning.thread_trial.record(
                        trial, threads, seconds, transitions
                    )
                return plan, result
            except th.OutOfMemoryError as error:
                cap = self.back_off(plan, error)
            # Outside the handler: the error's frames (and tensors) are gone.
            oom.release_cached_memory(device)
            self.log(
                f"out of memory: step redone with chunks of at most {cap} {self.unit}s",
            )

    def back_off(self, plan: StepPlan, error: BaseException) -> int:
        """Halves the chunk after an out-of-memory error in a step run by ``plan``.

        Args:
            plan: The plan of the failed step.
            error: The out-of-memory error.

        Returns:
            The new cap, in transitions.

        Raises:
            torch.OutOfMemoryError: if the failed chunks held one transition.
        """
        self.backed_off_cap = oom.halved_chunk(plan.largest_chunk, error, self.unit)
        return self.backed_off_cap

    def fit_budget(
        self,
        memory_budget: budget.Budget,
        profile: probe.ActivationProfile,
        *,
        device: th.device,
        resident_bytes: int,
        largest_batch: int,
    ) -> int:
        """Sets the memory cap: the largest chunk ``memory_budget`` holds.

        Args:
            memory_budget: Bytes or ``"auto"``.
            profile: The probe's measurements of the net.
            device: The net's device (``"auto"`` reads its free memory).
            resident_bytes: Training state already on the device.
            largest_batch: Units of the largest batch (no cap above it).

        Returns:
            The budget in bytes.

        Raises:
            ValueError: if not even one transition fits.
        """
        in_bytes = budget.resolve_budget(memory_budget, device, resident_bytes)
        cap = profile.max_chunk_transitions(in_bytes, largest_batch)
        if cap == 0:
            raise ValueError(
                f"memory_budget={memory_budget!r} ({budget.format_bytes(in_bytes)}) "
                f"is too small: one {self.unit} needs an estimated "
                f"{budget.format_bytes(profile.chunk_bytes(1, 1))} "
                f"({profile.describe()})",
            )
        self.budget_cap = cap
        return in_bytes
