"""Two gloo processes train as one process would.

Every scenario runs in one pair of spawned processes (module-scoped fixture, to pay
the start-up once); each rank saves what it saw, and the tests compare ranks with
each other and with a single-process run of the same trainer (which
tests/test_preference_exactness.py checks against an independent reference).
Naive variants of the engine (no compensation of DDP's averaging, rank 0's norm
statistics broadcast by DDP, a gradient reduction per minibatch) fail the same
checks.

The ``memory_budget`` scenarios take budgets computed from the trainer's own probe
for a chosen chunk size: one in which a pair fits (one pass, a pair per chunk) and
one in which it does not (two passes).
"""

import contextlib
import copy
import os
import pathlib
import socket
import time
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import torch as th
import torch.distributed as dist
import torch.multiprocessing as mp
from imitation.algorithms import preference_comparisons as pc
from imitation.regularization import regularizers, updaters
from imitation.rewards import reward_nets
from imitation.util import networks

from imitation_accum import CrossEntropyRewardTrainer, distributed
from imitation_accum.planning import probe as probe_module
from imitation_accum.preference import pair_table
from tests import reference as ref

WORLD_SIZE = 2
TIMEOUT_S = 240
PARAM_TOL = 1e-6  # relative; float32 round-off of a few SGD steps is ~1e-7


def make_dataset(n_pairs: int = 15, lengths=(3, 5)) -> pc.PreferenceDataset:
    return ref.make_dataset(np.random.default_rng(11), n_pairs, lengths)


def make_net(norm: type = networks.RunningNorm) -> reward_nets.RewardNet:
    th.manual_seed(0)
    return reward_nets.BasicRewardNet(
        ref.OBS_SPACE,
        ref.ACT_SPACE,
        hid_sizes=(16, 16),
        normalize_input_layer=norm,
    )


# batch 7 over 2 ranks: shares of 4 and 3 pairs, minibatches 2+2 and 2+1; 15 pairs
# end each epoch with a batch of one pair, in which rank 1 has nothing.
RUNNING_NORM_RUN = dict(
    batch_size=7,
    minibatch_size=2,
    epochs=3,
    lr=0.05,
    forward_size=3,
    optimizer_cls=th.optim.SGD,
)


# AdamW, equal-length fragments: the output bias has an exact gradient of zero,
# which must come out 0.0 on every rank (AdamW would turn round-off into a step).
ADAMW_RUN = dict(
    batch_size=8,
    minibatch_size=3,
    epochs=2,
    lr=0.01,
    forward_size=4,
    optimizer_cls=th.optim.AdamW,
)
ADAMW_DATA = dict(n_pairs=16, lengths=(6,))


# Every rank makes the same number of reward-net calls in every step (equal shares,
# one call per minibatch), as DDP's own buffer broadcast needs not to hang.
BALANCED_RUN = dict(
    batch_size=6,
    minibatch_size=3,
    epochs=2,
    lr=0.05,
    forward_size=1000,
    optimizer_cls=th.optim.SGD,
)
BALANCED_PAIRS = 12


# Pairs of fragments of 3 and 5 transitions: a pair holds 8.
ONE_PAIR_CHUNK, SPLIT_PAIR_CHUNK = 8, 6


def budget_run(chunk_transitions: int) -> Dict[str, Any]:
    """RUNNING_NORM_RUN with the budget in which chunks of this size just fit."""
    kwargs = dict(RUNNING_NORM_RUN, minibatch_size=None, progress_bar=False)
    probe = CrossEntropyRewardTrainer(
        pc.PreferenceModel(make_net()),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(3),
        **kwargs,
    )
    probe._task.refresh_device()
    profile = probe._profile(pair_table.read_preferences(make_dataset()))
    budget = int(profile.chunk_bytes(chunk_transitions, chunk_transitions))
    return dict(kwargs, memory_budget=budget)


def regularized_run() -> Dict[str, Any]:
    return dict(
        batch_size=6,
        minibatch_size=4,
        epochs=3,
        lr=0.05,
        forward_size=5,
        optimizer_cls=th.optim.SGD,
        max_grad_norm=0.5,
        regularizer_factory=regularizers.LpRegularizer.create(
            0.01,
            updaters.IntervalParamScaler(0.5, (0.9, 1.1)),
            val_split=0.25,
            p=2,
        ),
    )


def train(
    trainer_cls: type,
    net: reward_nets.RewardNet,
    kwargs: Dict[str, Any],
    *,
    seed: int = 3,
    discount: float = 1.0,
    n_pairs: int = 15,
    lengths=(3, 5),
    before: Callable[[Any], None] = lambda trainer: None,
) -> Any:
    kwargs = dict(kwargs)
    kwargs.setdefault("progress_bar", False)
    trainer = trainer_cls(
        pc.PreferenceModel(net, discount_factor=discount),
        pc.CrossEntropyRewardLoss(),
        np.random.default_rng(seed),
        **kwargs,
    )
    before(trainer)
    trainer.train(make_dataset(n_pairs, lengths))
    return trainer


def state_of(net: th.nn.Module) -> Dict[str, th.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def flat_state(net: th.nn.Module) -> th.Tensor:
    return th.cat([v.detach().reshape(-1).double() for v in net.state_dict().values()])


# --- what runs on each rank -------------------------------------------------


def watch_steps(trainer: distributed.DistributedRewardTrainer) -> List[Dict[str, Any]]:
    """Counts gradient reductions (a DDP comm hook) and records every step."""
    engine = trainer.engine
    assert isinstance(engine, distributed.DistributedGradientAccumulator)
    reductions = [0]

    def counting_allreduce(state, bucket):
        reductions[0] += 1
        # The default hook's arithmetic: average over ranks.
        buffer = bucket.buffer().div_(dist.get_world_size())
        work = dist.all_reduce(buffer, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    engine.ddp.register_comm_hook(None, counting_allreduce)
    steps: List[Dict[str, Any]] = []
    original = engine.step

    def step(task, chunks, **kwargs):
        before = reductions[0]
        result = original(task, chunks, **kwargs)
        steps.append(
            {
                "reductions": reductions[0] - before,
                "chunks": len(chunks),
                "two_pass": kwargs["plan"].two_pass,
                "state": flat_state(trainer._preference_model.model),
                "loss": result.loss,
                "accuracy": result.metrics["accuracy"],
            },
        )
        return result

    engine.step = step  # type: ignore[method-assign]
    return steps


def run_and_record(trainer_cls: type, net_factory, kwargs, **train_kwargs):
    watched: List[List[Dict[str, Any]]] = []
    net = net_factory()
    train(
        trainer_cls,
        net,
        kwargs,
        before=lambda trainer: watched.append(watch_steps(trainer)),
        **train_kwargs,
    )
    return {"state": state_of(net), "steps": watched[0]}


class NoCompensationEngine(distributed.DistributedGradientAccumulator):
    """Naive: lets DDP average the rank gradients (half the update on 2 ranks)."""

    def _backward(self, loss):
        loss.backward()


class RankZeroBuffersEngine(distributed.DistributedGradientAccumulator):
    """Naive: each rank's own norm moments, then DDP broadcasts rank 0's buffers."""

    def _ddp_options(self):
        return {}

    def _all_reduce_moments(self, moments):
        return moments


class SyncEveryMinibatchEngine(distributed.DistributedGradientAccumulator):
    """Naive: no ``no_sync``: one reduction per minibatch."""

    def _chunk_context(self, index, n_chunks):
        return contextlib.nullcontext()


def trainer_with(engine_cls: type) -> type:
    class Trainer(distributed.DistributedRewardTrainer):
        def _make_engine(self):
            return engine_cls(
                self._preference_model.model, empty_forward=self._empty_forward
            )

    return Trainer


def scenario_auto_forward_size(rank: int) -> Dict[str, Any]:
    """Were the ranks' default sizes to differ, every rank uses rank 0's."""
    original = probe_module.ActivationProfile.forward_size

    def rank_dependent(self):
        return 2 if rank == 0 else 5

    used: List[int] = []
    probe_module.ActivationProfile.forward_size = rank_dependent  # type: ignore
    try:

        def before(trainer):
            run = trainer._task.run  # every reward-net call, staged or gathered

            def recording_run(inputs, start, stop, module=None):
                if module is None:  # a step's call, not the probe's
                    used.append(stop - start)
                return run(inputs, start, stop, module)

            trainer._task.run = recording_run

        kwargs = dict(RUNNING_NORM_RUN, forward_size="auto", epochs=1)
        train(distributed.DistributedRewardTrainer, make_net(), kwargs, before=before)
    finally:
        probe_module.ActivationProfile.forward_size = original  # type: ignore
    return {"max_call": max(used)}


def expect_value_error(make: Callable[[], Any]) -> str:
    try:
        make()
    except ValueError as error:
        return str(error)
    return "no error"


def scenarios(rank: int) -> Dict[str, Any]:
    trainer_cls = distributed.DistributedRewardTrainer
    regularized = regularized_run()
    return {
        "running_norm": run_and_record(trainer_cls, make_net, RUNNING_NORM_RUN),
        "two_pass": run_and_record(
            trainer_cls,
            make_net,
            dict(RUNNING_NORM_RUN, two_pass=True),
        ),
        "budget_one_pass": run_and_record(
            trainer_cls,
            make_net,
            budget_run(ONE_PAIR_CHUNK),
        ),
        "budget_two_pass": run_and_record(
            trainer_cls,
            make_net,
            budget_run(SPLIT_PAIR_CHUNK),
        ),
        "ema_regularized": run_and_record(
            trainer_cls,
            lambda: make_net(networks.EMANorm),
            regularized,
            discount=0.9,
        ),
        "no_compensation": run_and_record(
            trainer_with(NoCompensationEngine),
            make_net,
            RUNNING_NORM_RUN,
        ),
        "rank0_buffers": run_and_record(
            trainer_with(RankZeroBuffersEngine),
            make_net,
            BALANCED_RUN,
            n_pairs=BALANCED_PAIRS,
        ),
        "sync_every_minibatch": run_and_record(
            trainer_with(SyncEveryMinibatchEngine),
            make_net,
            dict(RUNNING_NORM_RUN, epochs=1),
        ),
        "adamw_equal_lengths": run_and_record(
            trainer_cls,
            make_net,
            ADAMW_RUN,
            **ADAMW_DATA,
        ),
        "auto_forward_size": scenario_auto_forward_size(rank),
        "batch_smaller_than_world": expect_value_error(
            lambda: train(trainer_cls, make_net(), dict(batch_size=1)),
        ),
        "rng_differs": expect_value_error(
            lambda: train(trainer_cls, make_net(), dict(batch_size=4), seed=rank),
        ),
    }


def worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    th.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        th.save(scenarios(rank), pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_on_ranks(out_dir: pathlib.Path) -> List[Dict[str, Any]]:
    context = mp.start_processes(
        worker,
        args=(WORLD_SIZE, free_port(), str(out_dir)),
        nprocs=WORLD_SIZE,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks still running after {TIMEOUT_S} s (a hang)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [
        th.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)
    ]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> List[Dict[str, Any]]:
    return run_on_ranks(tmp_path_factory.mktemp("ranks"))


def single_process(net_factory, kwargs, **train_kwargs) -> Dict[str, Any]:
    """The same training in this process, with each step's loss and accuracy."""
    net = net_factory()
    steps: List[Dict[str, float]] = []

    def record_steps(trainer):
        original = trainer.engine.step

        def step(task, chunks, **kwargs):
            result = original(task, chunks, **kwargs)
            steps.append({"loss": result.loss, "accuracy": result.metrics["accuracy"]})
            return result

        trainer.engine.step = step

    train(CrossEntropyRewardTrainer, net, kwargs, before=record_steps, **train_kwargs)
    buffers = {name for name, _ in net.named_buffers()}
    state = state_of(net)
    return {
        "params": {k: v for k, v in state.items() if k not in buffers},
        "buffers": {k: v for k, v in state.items() if k in buffers},
        "steps": steps,
    }


def relative_error(actual: Dict[str, th.Tensor], expected: Dict[str, th.Tensor]):
    keys = sorted(expected)
    return ref.relative_error([actual[k] for k in keys], [expected[k] for k in keys])


# --- the checks -------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "net_factory", "kwargs", "train_kwargs"),
    [
        ("running_norm", make_net, RUNNING_NORM_RUN, {}),
        # chunks of 3 transitions, smaller than a pair: the two-pass method
        ("two_pass", make_net, dict(RUNNING_NORM_RUN, two_pass=True), {}),
        (
            "ema_regularized",
            lambda: make_net(networks.EMANorm),
            None,
            {"discount": 0.9},
        ),
    ],
)
def test_two_ranks_equal_one_process(
    ranks, scenario, net_factory, kwargs, train_kwargs
):
    kwargs = regularized_run() if kwargs is None else kwargs
    expected = single_process(net_factory, kwargs, **train_kwargs)
    assert expected["buffers"], "the net must have norm buffers"
    for rank in ranks:
        actual = rank[scenario]["state"]
        assert relative_error(actual, expected["params"]) < PARAM_TOL
        assert relative_error(actual, expected["buffers"]) < PARAM_TOL
        # Every step's loss and accuracy are the whole batch's, on every rank.
        steps = rank[scenario]["steps"]
        assert len(steps) == len(expected["steps"])
        for got, want in zip(steps, expected["steps"]):
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
            assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-9)


def test_two_ranks_under_adamw_equal_one_process(ranks):
    expected = single_process(make_net, ADAMW_RUN, **ADAMW_DATA)
    for rank in ranks:
        actual = rank["adamw_equal_lengths"]["state"]
        assert relative_error(actual, expected["params"]) < PARAM_TOL
        bias = "mlp.dense_final.bias"
        assert th.equal(actual[bias], expected["params"][bias])


@pytest.mark.parametrize(
    ("scenario", "two_pass"),
    [("budget_one_pass", False), ("budget_two_pass", True)],
)
def test_two_ranks_with_a_memory_budget_equal_one_process(ranks, scenario, two_pass):
    # The reference: one process with a fixed minibatch size (itself checked
    # against the plain full-batch reference elsewhere); any chunking is exact.
    expected = single_process(make_net, RUNNING_NORM_RUN)
    for rank in ranks:
        assert relative_error(rank[scenario]["state"], expected["params"]) < PARAM_TOL
        assert relative_error(rank[scenario]["state"], expected["buffers"]) < PARAM_TOL
        # (A rank with no pairs in a step runs no chunk, in neither mode.)
        modes = {step["two_pass"] for step in rank[scenario]["steps"] if step["chunks"]}
        assert modes == {two_pass}
    # The budget, not a minibatch size, split each share: rank 0's share of 4
    # pairs ran in 4 one-pair chunks, or, two-pass, in 11 ranges of its 32
    # transitions (one reward-net call of forward_size=3 each, under the cap of 6).
    first_step = ranks[0][scenario]["steps"][0]
    assert first_step["chunks"] == (11 if two_pass else 4)


def test_a_rank_without_pairs_joins_the_step(ranks):
    steps = [rank["running_norm"]["steps"] for rank in ranks]
    assert len(steps[0]) == len(steps[1]) == 9
    # the last batch of every epoch holds one pair, which rank 0 takes
    assert [s["chunks"] for s in steps[1][2::3]] == [0, 0, 0]
    assert all(s["reductions"] == 1 for s in steps[1])


def test_one_gradient_reduction_per_step(ranks):
    for rank in ranks:
        steps = rank["running_norm"]["steps"]
        assert max(s["chunks"] for s in steps) == 2
        assert [s["reductions"] for s in steps] == [1] * len(steps)
        two_pass = rank["two_pass"]["steps"]
        assert all(s["two_pass"] for s in two_pass if s["chunks"])
        assert max(s["chunks"] for s in two_pass) > 2
        assert [s["reductions"] for s in two_pass] == [1] * len(two_pass)
    # Without no_sync every minibatch reduces: two per step where a rank has two.
    naive = ranks[0]["sync_every_minibatch"]["steps"]
    assert [s["reductions"] for s in naive] == [2, 2, 1]


def test_ranks_hold_identical_state_after_every_step(ranks):
    for scenario in ("running_norm", "ema_regularized"):
        first, second = (rank[scenario]["steps"] for rank in ranks)
        assert len(first) == len(second) > 0
        for a, b in zip(first, second):
            assert th.equal(a["state"], b["state"])


def test_naive_variants_fail(ranks):
    expected = single_process(make_net, RUNNING_NORM_RUN)
    params = expected["params"]
    # DDP's averaging left alone: half the gradient.
    naive = ranks[0]["no_compensation"]["state"]
    assert relative_error(naive, params) > 1e3 * PARAM_TOL
    # DDP's broadcast of rank 0's statistics: not the whole batch's.
    balanced = single_process(make_net, BALANCED_RUN, n_pairs=BALANCED_PAIRS)
    for rank in ranks:
        broadcast = rank["rank0_buffers"]["state"]
        assert relative_error(broadcast, balanced["buffers"]) > 1e3 * PARAM_TOL


def test_auto_forward_size_is_rank_zero_choice(ranks):
    assert [rank["auto_forward_size"]["max_call"] for rank in ranks] == [2, 2]


def test_bad_setups_are_named(ranks):
    for rank in ranks:
        assert (
            "batch_size=1 is smaller than the number of processes (2)"
            in (rank["batch_smaller_than_world"])
        )
        assert "rng must be seeded identically" in rank["rng_differs"]
        assert "ranks [1]" in rank["rng_differs"]


# --- single-process pieces --------------------------------------------------


@pytest.mark.parametrize("n_items", [0, 1, 2, 5, 7, 8])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_local_shares_are_disjoint_and_cover_the_batch(n_items, world_size):
    batch = np.arange(100, 100 + n_items)
    shares = [distributed.local_share(batch, r, world_size) for r in range(world_size)]
    assert np.array_equal(np.concatenate(shares), batch)
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1


def test_failure_names_the_rank():
    context = distributed.DistributedContext(rank=1, world_size=2)
    failing = distributed.reporting_failures(context)
    expected = pytest.raises(distributed.RankFailedError, match=r"rank 1 of 2 failed: ")
    with expected, failing:
        raise FloatingPointError("non-finite loss")
    single = distributed.DistributedContext()
    with pytest.raises(FloatingPointError), distributed.reporting_failures(single):
        raise FloatingPointError("non-finite loss")


def test_failure_is_recorded_for_torchrun(tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    context = distributed.DistributedContext(rank=3, world_size=4)
    reporting = distributed.reporting_failures(context)
    with pytest.raises(distributed.RankFailedError), reporting:
        raise RuntimeError("disk full")
    assert "rank 3 of 4 failed: RuntimeError: disk full" in error_file.read_text()


def test_single_process_context_without_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    context = distributed.init_distributed("cpu")
    assert not context.distributed and context.is_main
    assert context.device == th.device("cpu") and context.backend is None
    assert not dist.is_initialized()
    assert distributed.backend_for(th.device("cuda", 0)) == "nccl"
    assert distributed.backend_for(th.device("cpu")) == "gloo"


def test_trainer_outside_a_group_is_the_plain_trainer():
    net = make_net()
    reference = copy.deepcopy(net)
    train(distributed.DistributedRewardTrainer, net, RUNNING_NORM_RUN)
    train(CrossEntropyRewardTrainer, reference, RUNNING_NORM_RUN)
    for a, b in zip(state_of(net).values(), state_of(reference).values()):
        assert th.equal(a, b)
