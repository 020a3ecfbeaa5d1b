"""AIRL and GAIL that checkpoint every few rounds and resume bit for bit.

:func:`resumable_class` makes, of this package's ``AIRL`` or ``GAIL``, a class whose
``train()`` writes a checkpoint (:mod:`imitation_accum.io.run_checkpoint`) every
``interval`` rounds and after the last, and starts after the rounds a checkpoint
holds. A checkpoint holds:

- ``state.pt`` (tensors and plain values, read with ``weights_only=True``): the
  discriminator's reward net (AIRL's with its potential; norm statistics included)
  and optimizer, the rounds completed, the global and discriminator step counters
  (the logger's steps), where the expert batches are (the torch generator's state
  when the current pass over the demonstrations began, and the batches taken
  since), and the global generators (``random``, numpy's: the replay buffer's
  draws, torch's);
- ``agent.zip`` and ``environments.pkl``: the generator, as for preference
  comparisons (:mod:`imitation_accum.io.run_state`);
- ``replay_buffer.pkl``: the generator replay buffer (numpy arrays).

The demonstrations are not saved: a resumed run loads them from its config.
"""

import functools
import io
import pickle
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

import torch as th
import tqdm
from imitation.util import networks

from imitation_accum.io import run_checkpoint, run_state

#: The experiment whose checkpoints these are.
EXPERIMENT = "train_adversarial"
_STATE = "state.pt"
_AGENT = "agent.zip"
_ENVIRONMENTS = "environments.pkl"
_REPLAY_BUFFER = "replay_buffer.pkl"


class ExpertBatches(Iterator[Any]):
    """Batches of a data loader, pass after pass, that can resume where they were.

    imitation's ``endless_iter`` gives the same batches; this one also knows the
    torch generator's state when the current pass began (its shuffle draws from
    it) and how many batches the pass gave, which is enough to rebuild it.

    Args:
        loader: A ``DataLoader`` whose passes draw only from torch's generator
            when they begin (no worker processes).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._pass: Optional[Iterator[Any]] = None
        self._began: Optional[th.Tensor] = None
        self._taken = 0

    def __next__(self) -> Any:
        while True:
            if self._pass is None:
                self._began, self._taken = th.get_rng_state(), 0
                self._pass = iter(self.loader)
            try:
                batch = next(self._pass)
            except StopIteration:
                self._pass = None
                continue
            self._taken += 1
            return batch

    def state(self) -> Dict[str, Any]:
        """Where the batches are: plain values and a tensor."""
        began = None if self._pass is None else self._began
        return {"began": began, "taken": self._taken}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Goes back to where :meth:`state` was taken (torch's generator untouched)."""
        self._pass, self._taken = None, 0
        if state["began"] is None:
            return
        now = th.get_rng_state()
        th.set_rng_state(state["began"])
        try:
            self._began, self._pass = state["began"], iter(self.loader)
            for _ in range(int(state["taken"])):
                next(self._pass)
            self._taken = int(state["taken"])
        finally:
            th.set_rng_state(now)


class ResumableRounds:
    """What :func:`resumable_class` adds to an adversarial trainer class."""

    checkpointing: run_checkpoint.Checkpointing
    command: str
    _round: int = 0
    #: Whether the log already says that the environments cannot be saved.
    _unsaved_environments_warned: bool = False

    def set_demonstrations(self, demonstrations: Any) -> None:
        """As imitation's, the expert batches resumable (:class:`ExpertBatches`)."""
        super().set_demonstrations(demonstrations)  # type: ignore[misc]
        trainer: Any = self
        trainer._endless_expert_iterator = ExpertBatches(trainer._demo_data_loader)

    def train(
        self, total_timesteps: int, callback: Optional[Callable[[int], None]] = None
    ) -> None:
        """Trains as imitation's ``train()``; resumes first, checkpoints every few.

        A copy of imitation 1.0.1's loop, which cannot start at a round: the same
        steps in the same order, from the rounds a checkpoint holds.

        Raises:
            ValueError: if ``total_timesteps`` is less than one round's.
        """
        trainer: Any = self
        n_rounds = total_timesteps // trainer.gen_train_timesteps
        if n_rounds < 1:
            raise ValueError(
                f"total_timesteps={total_timesteps} is less than one round "
                f"(gen_train_timesteps={trainer.gen_train_timesteps})"
            )
        if self.checkpointing.resume_from is not None:
            self._resume(self.checkpointing.resume_from)
        interval = self.checkpointing.interval
        for r in tqdm.tqdm(range(self._round, n_rounds), desc="round"):
            trainer.train_gen(trainer.gen_train_timesteps)
            for _ in range(trainer.n_disc_updates_per_round):
                with networks.training(trainer.reward_train):
                    trainer.train_disc()
            if callback:
                callback(r)
            trainer.logger.dump(trainer._global_step)
            self._round = r + 1
            if self._round % interval == 0 or self._round == n_rounds:
                self._checkpoint()

    def _shared(self) -> Dict[str, Any]:
        trainer: Any = self
        return {
            "trainer": self,
            "reward_net": trainer._reward_net,
            "reward_train": trainer.reward_train,
            "reward_test": trainer.reward_test,
            "agent": trainer.gen_algo,
            "policy": trainer.gen_algo.policy,
        }

    def _write_files(self, directory: Any) -> Dict[str, Any]:
        trainer: Any = self
        net = trainer._reward_net
        state = {
            "round": self._round,
            "global_step": int(trainer._global_step),
            "disc_step": int(trainer._disc_step),
            "net_state": {k: v.detach().cpu() for k, v in net.state_dict().items()},
            "optimizer_state": trainer._disc_opt.state_dict(),
            "expert_batches": trainer._endless_expert_iterator.state(),
            "generators": run_state.capture_generators({}),
        }
        th.save(state, directory / _STATE)
        agent = trainer.gen_algo
        (directory / _AGENT).write_bytes(run_state.save_agent(agent))
        buffer = io.BytesIO()
        pickle.dump(trainer._gen_replay_buffer, buffer)
        (directory / _REPLAY_BUFFER).write_bytes(buffer.getvalue())
        try:
            saved = run_state.save_environments(agent.get_env(), self._shared())
        except (TypeError, AttributeError, ValueError, pickle.PicklingError) as error:
            if not self._unsaved_environments_warned:  # once a run, not every round
                trainer.logger.warn(
                    f"The environments cannot be saved ({error}): a resumed run "
                    "restarts them from reset with a seed derived from the run's seed "
                    "and the round, and is not bit-identical to an uninterrupted one "
                    "(environment.parallel=False keeps them in this process)"
                )
                self._unsaved_environments_warned = True
            return {"round": self._round, "environments": f"not saved: {error}"}
        (directory / _ENVIRONMENTS).write_bytes(saved)
        return {"round": self._round, "environments": "saved"}

    def _checkpoint(self) -> None:
        log_dir = self.checkpointing.log_dir
        if log_dir is None:
            return
        start = time.perf_counter()
        path = run_checkpoint.write(
            log_dir,
            self._round,
            experiment=EXPERIMENT,
            command=self.command,
            config=self.checkpointing.config,
            write_files=self._write_files,
        )
        trainer: Any = self
        trainer.logger.log(
            f"Checkpoint after round {self._round} written to {path} in "
            f"{time.perf_counter() - start:.3f} s"
        )

    def _resume(self, checkpoint: Any) -> None:
        trainer: Any = self
        where = f"checkpoint {str(checkpoint)!r}"
        state = th.load(checkpoint / _STATE, map_location="cpu", weights_only=True)
        net = trainer._reward_net
        try:
            with th.no_grad():
                net.load_state_dict(state["net_state"])
            trainer._disc_opt.load_state_dict(state["optimizer_state"])
        except (RuntimeError, ValueError, KeyError) as error:
            raise ValueError(
                f"{where}: its reward net does not fit: {error}"
            ) from error
        buffer = run_checkpoint.file_bytes(checkpoint, _REPLAY_BUFFER)
        trainer._gen_replay_buffer = pickle.loads(buffer)
        agent = trainer.gen_algo
        run_state.restore_agent(
            agent, run_checkpoint.file_bytes(checkpoint, _AGENT), where
        )
        if (checkpoint / _ENVIRONMENTS).is_file():
            saved = run_checkpoint.file_bytes(checkpoint, _ENVIRONMENTS)
            run_state.restore_environments(
                agent.get_env(), saved, self._shared(), where
            )
        else:
            seed = run_state.derived_seed(self.checkpointing.seed, state["round"])
            run_state.reseed_environments(agent, agent.get_env(), seed)
            trainer.logger.warn(
                f"{where} holds no environments: they restart from reset with seed "
                f"{seed} (derived from the run's seed and round {state['round']})"
            )
        trainer._endless_expert_iterator.restore(state["expert_batches"])
        run_state.restore_generators({}, state["generators"], where)
        trainer._global_step = int(state["global_step"])
        trainer._disc_step = int(state["disc_step"])
        self._round = int(state["round"])
        trainer.logger.log(f"Resumed from {checkpoint} after round {self._round}")


@functools.cache
def resumable_class(algo_cls: type) -> type:
    """``algo_cls`` (this package's ``AIRL`` or ``GAIL``) with checkpoints and resumes.

    Its constructor takes ``algo_cls``'s arguments plus the keyword arguments
    ``checkpointing`` (:class:`~imitation_accum.io.run_checkpoint.Checkpointing`)
    and ``command`` (the experiment's command, recorded in checkpoints).
    """

    class Resumable(ResumableRounds, algo_cls):
        def __init__(
            self,
            *args: Any,
            checkpointing: run_checkpoint.Checkpointing,
            command: str,
            **kwargs: Any,
        ) -> None:
            self.checkpointing, self.command, self._round = checkpointing, command, 0
            super().__init__(*args, **kwargs)

    Resumable.__name__ = Resumable.__qualname__ = f"Resumable{algo_cls.__name__}"
    return Resumable
