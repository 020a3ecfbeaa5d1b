"""AIRL and GAIL that checkpoint every few rounds and resume bit for bit.

:func:`resumable_class` makes, of this package's ``AIRL`` or ``GAIL``, a class whose
``train()`` writes a checkpoint (:mod:`imitation_accum.io.run_checkpoint`) every
``interval`` rounds and after the last, and starts after the rounds one holds:

- ``state.pt`` (read with ``weights_only=True``): the discriminator's reward net
  and optimizer, the rounds done, the global and discriminator steps, where the
  expert batches are (:class:`ExpertBatches`) and the global generators;
- ``agent.zip`` and ``environments.pkl`` (:mod:`imitation_accum.io.run_state`);
- ``replay_buffer.pkl``: the generator replay buffer, pickled (imitation keeps its
  infos as objects); read back only with ``trust_pickle``.

The demonstrations are not saved: a resumed run loads them from its config.
"""

import functools
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
#: The checkpoint's pickle of the replay buffer (read only with ``trust_pickle``).
REPLAY_BUFFER = "replay_buffer.pkl"


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
        (directory / REPLAY_BUFFER).write_bytes(
            pickle.dumps(trainer._gen_replay_buffer, pickle.HIGHEST_PROTOCOL)
        )
        error = run_state.save_agent_and_environments(
            directory, trainer.gen_algo, self._shared()
        )
        if error is not None and not self._unsaved_environments_warned:
            trainer.logger.warn(
                f"The environments cannot be saved ({error}): a resumed run "
                "restarts them from reset with a seed derived from the run's seed "
                "and the round, and is not bit-identical to an uninterrupted one "
                "(environment.parallel=False keeps them in this process)"
            )
            self._unsaved_environments_warned = True  # once a run, not every round
        saved = "saved" if error is None else f"not saved: {error}"
        return {"round": self._round, "environments": saved}

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
        if not self.checkpointing.trust_pickle:
            raise ValueError(
                f"{where} holds the replay buffer as a pickle ({REPLAY_BUFFER}), and "
                "loading a pickle runs any code it holds: set trust_pickle=True if "
                "you trust the checkpoint"
            )
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
        buffer = (checkpoint / REPLAY_BUFFER).read_bytes()
        trainer._gen_replay_buffer = pickle.loads(buffer)
        seed = run_state.restore_agent_and_environments(
            checkpoint,
            trainer.gen_algo,
            self._shared(),
            run_state.derived_seed(self.checkpointing.seed, state["round"]),
        )
        if seed is not None:
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
