"""Preference comparisons that checkpoint every iteration and resume bit for bit.

:class:`ResumablePreferenceComparisons` is imitation's ``PreferenceComparisons`` with a
checkpoint (:mod:`imitation_accum.io.run_checkpoint`) written after every iteration,
and a ``train()`` that starts after the iterations a checkpoint holds:

- ``state.pt`` (read with ``weights_only=True``): the reward trainer's
  :class:`~imitation_accum.io.training_state.TrainingState` (one per ensemble member
  too), the iterations done, the query schedule, every generator, which policy the
  exploration wrapper is on, the last reward loss;
- ``agent.zip`` and ``environments.pkl`` (:mod:`imitation_accum.io.run_state`);
- under ``"preferences"`` in ``checkpoint.json``'s metadata: the store holding the
  dataset and its manifest as of this checkpoint. The store,
  ``checkpoints/resume/preferences.NNNNNN/``, lives beside the checkpoints and
  grows in place (:class:`imitation_accum.io.frame_store.Appender`); a resume
  reads the rows the checkpoint commits, verified. Where ``max_size`` evicted
  pairs, a new store takes them all.

Where the environments could not be saved, a resumed run restarts them from
``reset`` with a seed derived from the run's seed and the iteration (logged).
"""

import dataclasses
import math
import pathlib
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type, cast

import numpy as np
import torch as th
from imitation.algorithms import preference_comparisons as pc
from imitation.util import util

from imitation_accum.io import frame_store, run_checkpoint, run_state, training_state
from imitation_accum.preference import held_out
from imitation_accum.preference.dataset import PreferenceDataset

#: The experiment whose checkpoints these are.
EXPERIMENT = "train_preference_comparisons"
_STATE = "state.pt"
_PREFERENCES = "preferences"


class ResumablePreferenceComparisons(pc.PreferenceComparisons):
    """imitation's ``PreferenceComparisons``, checkpointed every iteration.

    Args:
        *args: imitation's arguments.
        checkpointing: Where to write checkpoints and what to resume.
        held_out_pairs: After training, score the reward net on this many fresh
            fragment pairs (:func:`imitation_accum.preference.held_out.evaluate`);
            0 (the default) skips it.
        **kwargs: imitation's keyword arguments.

    Example:
        >>> trainer = ResumablePreferenceComparisons(  # doctest: +SKIP
        ...     agent_trainer, reward_net, num_iterations=10,
        ...     checkpointing=run_checkpoint.Checkpointing(log_dir, config, seed))
        >>> trainer.train(total_timesteps, total_comparisons)  # doctest: +SKIP
    """

    def __init__(
        self,
        *args: Any,
        checkpointing: run_checkpoint.Checkpointing,
        held_out_pairs: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.checkpointing = checkpointing
        self.held_out_pairs = held_out_pairs
        self._results: Tuple[Optional[float], Optional[float]] = (None, None)
        self._unsaved_environments: Optional[str] = None
        # The preference store the last checkpoint committed, and the one appended
        # to by the checkpoint being written.
        self._store: Optional[frame_store.Appender] = None
        self._appended: Optional[frame_store.Appender] = None

    def train(
        self,
        total_timesteps: int,
        total_comparisons: int,
        callback: Optional[Callable[[int], None]] = None,
    ) -> Mapping[str, Any]:
        """Trains as imitation's ``train()``; resumes first, checkpoints each iteration.

        A copy of imitation 1.0.1's loop, which cannot start at an iteration: the
        same steps in the same order, from ``self._iteration``.

        Returns:
            The final reward loss and accuracy, as imitation's; with
            ``held_out_pairs``, also the held-out accuracy and the count of
            non-tied pairs it is measured on
            (:mod:`~imitation_accum.preference.held_out`).
        """
        initial_comparisons = int(total_comparisons * self.initial_comparison_frac)
        total_comparisons -= initial_comparisons
        vec_schedule = np.vectorize(self.query_schedule)
        unnormalized_probs = vec_schedule(np.linspace(0, 1, self.num_iterations))
        probs = unnormalized_probs / np.sum(unnormalized_probs)
        shares = util.oric(probs * total_comparisons)
        schedule = [initial_comparisons, *shares.tolist()]
        print(f"Query schedule: {schedule}")
        timesteps_per_iteration, extra_timesteps = divmod(
            total_timesteps, self.num_iterations
        )
        if self.checkpointing.resume_from is not None:
            self._resume(self.checkpointing.resume_from, schedule)
        reward_loss, reward_accuracy = self._results

        for i, num_pairs in enumerate(schedule):
            if i < self._iteration:  # done before the checkpoint resumed
                continue
            num_steps = math.ceil(
                self.transition_oversampling * 2 * num_pairs * self.fragment_length
            )
            self.logger.log(
                f"Collecting {2 * num_pairs} fragments ({num_steps} transitions)"
            )
            trajectories = self.trajectory_generator.sample(num_steps)
            horizons = (len(traj) for traj in trajectories if traj.terminal)
            self._check_fixed_horizon(horizons)
            self.logger.log("Creating fragment pairs")
            fragments = self.fragmenter(trajectories, self.fragment_length, num_pairs)
            with self.logger.accumulate_means("preferences"):
                self.logger.log("Gathering preferences")
                preferences = self.preference_gatherer(fragments)
            self.dataset.push(fragments, preferences)
            self.logger.log(f"Dataset now contains {len(self.dataset)} comparisons")

            epoch_multiplier = self.initial_epoch_multiplier if i == 0 else 1.0
            self.reward_trainer.train(self.dataset, epoch_multiplier=epoch_multiplier)
            base_key = self.logger.get_accumulate_prefixes() + "reward/final/train"
            assert f"{base_key}/loss" in self.logger.name_to_value
            assert f"{base_key}/accuracy" in self.logger.name_to_value
            reward_loss = self.logger.name_to_value[f"{base_key}/loss"]
            reward_accuracy = self.logger.name_to_value[f"{base_key}/accuracy"]

            num_steps = timesteps_per_iteration
            if i == self.num_iterations - 1:
                num_steps += extra_timesteps
            with self.logger.accumulate_means("agent"):
                self.logger.log(f"Training agent for {num_steps} timesteps")
                self.trajectory_generator.train(steps=num_steps)

            self.logger.dump(self._iteration)
            if callback:
                callback(self._iteration)
            self._iteration += 1
            self._results = (reward_loss, reward_accuracy)
            self._checkpoint(schedule)
        results: Dict[str, Any] = {
            "reward_loss": reward_loss,
            "reward_accuracy": reward_accuracy,
        }
        if self.held_out_pairs > 0:
            trainer = cast(pc.BasicRewardTrainer, self.reward_trainer)
            results.update(
                held_out.evaluate(
                    self.trajectory_generator,
                    trainer._preference_model,  # imitation keeps no public one
                    num_pairs=self.held_out_pairs,
                    fragment_length=self.fragment_length,
                    rng=trainer.rng,  # done drawing for training
                    transition_oversampling=self.transition_oversampling,
                    logger=self.logger,
                )
            )
        return results

    # What a checkpoint holds ------------------------------------------------------

    def _agent(self) -> Any:
        generator = self.trajectory_generator
        return generator.algorithm if isinstance(generator, pc.AgentTrainer) else None

    def _generators(self) -> Dict[str, np.random.Generator]:
        owners = {
            "preference_comparisons": self,
            "reward_trainer": self.reward_trainer,
            "fragmenter": self.fragmenter,
            "base_fragmenter": getattr(self.fragmenter, "base_fragmenter", None),
            "gatherer": self.preference_gatherer,
            "trajectory_generator": self.trajectory_generator,
            "exploration": getattr(
                self.trajectory_generator, "exploration_wrapper", None
            ),
        }
        for i, member in enumerate(getattr(self.reward_trainer, "member_trainers", [])):
            owners[f"reward_trainer.member{i}"] = member
        found = {}
        for name, owner in owners.items():
            rng = getattr(owner, "rng", None)
            if isinstance(rng, np.random.Generator):
                found[name] = rng
        return found

    def _shared(self) -> Dict[str, Any]:
        # What the environments refer to that this run builds itself.
        agent = self._agent()
        shared: Dict[str, Any] = {"reward_net": self.model}
        if agent is not None:
            shared.update(agent=agent, policy=agent.policy)
        return shared

    def _exploring(self) -> Optional[bool]:
        wrapper = getattr(self.trajectory_generator, "exploration_wrapper", None)
        if wrapper is None:
            return None
        return wrapper.current_policy == wrapper._random_policy

    def _state(self, schedule: List[int]) -> Dict[str, Any]:
        trainer = cast(pc.BasicRewardTrainer, self.reward_trainer)
        members = getattr(trainer, "member_trainers", [])
        return {
            "iteration": int(self._iteration),
            "schedule": [int(n) for n in schedule],
            "trainer": dataclasses.asdict(
                training_state.capture_state(trainer, epoch=self._iteration)
            ),
            "members": [
                dataclasses.asdict(
                    training_state.capture_state(m, epoch=self._iteration)
                )
                for m in members
            ],
            "generators": run_state.capture_generators(self._generators()),
            "exploring": self._exploring(),
            "results": [None if v is None else float(v) for v in self._results],
        }

    def _write_files(
        self, directory: pathlib.Path, schedule: List[int]
    ) -> Dict[str, Any]:
        th.save(self._state(schedule), directory / _STATE)
        agent = self._agent()
        environments = "no agent"
        if agent is not None:
            error = run_state.save_agent_and_environments(
                directory, agent, self._shared()
            )
            if error is not None and self._unsaved_environments is None:
                self.logger.warn(
                    f"The environments cannot be saved ({error}): a resumed run "
                    "restarts them from reset with a seed derived from the run's "
                    "seed and the iteration, and is not bit-identical to an "
                    "uninterrupted one"
                )
                self._unsaved_environments = error  # warned once a run
            environments = "saved" if error is None else f"not saved: {error}"
        metadata = {"iteration": int(self._iteration), "environments": environments}
        if len(self.dataset):
            metadata.update(self._append_preferences(directory.parent))
        return metadata

    def _append_preferences(self, root: pathlib.Path) -> Dict[str, Any]:
        """Appends the pairs pushed since the last checkpoint to the run's store.

        Returns:
            What ``checkpoint.json`` records: the store and its manifest, and its
            files' committed sizes (:data:`run_checkpoint.SHARED`).
        """
        dataset = self.dataset
        if not isinstance(dataset, PreferenceDataset):
            raise TypeError(
                "checkpoints hold imitation_accum's PreferenceDataset (run under "
                f"imitation_accum.patched()), not a {type(dataset).__name__}"
            )
        store, manifest = self._store, None
        # A store of another run directory (resumed into a new log_dir) is not
        # this run's to grow.
        if store is not None and store.path.parent.resolve() == root.resolve():
            manifest = dataset.append_to(store)
        if manifest is None:  # the first store, or pairs were evicted since
            name = f"{_PREFERENCES}.{self._iteration:06d}"
            store = frame_store.Appender.create(root / name)
            manifest = dataset.append_to(store)
            assert manifest is not None
        assert store is not None
        self._appended = store
        sizes = frame_store.committed_bytes(manifest)
        return {
            _PREFERENCES: {"store": store.path.name, "manifest": manifest},
            run_checkpoint.SHARED: {
                f"{store.path.name}/{file}": n for file, n in sizes.items()
            },
        }

    def _checkpoint(self, schedule: List[int]) -> None:
        log_dir = self.checkpointing.log_dir
        if log_dir is None:
            return
        start = time.perf_counter()
        self._appended = None
        try:
            path = run_checkpoint.write(
                log_dir,
                self._iteration,
                experiment=EXPERIMENT,
                command=EXPERIMENT,
                config=self.checkpointing.config,
                write_files=lambda directory: self._write_files(directory, schedule),
            )
        except BaseException:
            # Whether the checkpoint is in place is not known: the next one starts
            # a new store rather than cut back one that it may need.
            self._store = None
            raise
        if self._appended is not None:
            self._appended.commit()
        self._store = self._appended
        self.logger.log(
            f"Checkpoint after iteration {self._iteration} written to {path} in "
            f"{time.perf_counter() - start:.3f} s"
        )

    # Resuming ---------------------------------------------------------------------

    def _resume(self, checkpoint: pathlib.Path, schedule: List[int]) -> None:
        where = f"checkpoint {str(checkpoint)!r}"
        state = th.load(checkpoint / _STATE, map_location="cpu", weights_only=True)
        if state["schedule"] != [int(n) for n in schedule]:
            raise ValueError(
                f"{where} was written for the query schedule {state['schedule']}, "
                f"but this run's is {schedule}: resume with the same "
                "total_comparisons, num_iterations, initial_comparison_frac and "
                "query_schedule"
            )
        trainer = cast(pc.BasicRewardTrainer, self.reward_trainer)
        training_state.restore_state(
            trainer, training_state.TrainingState(**state["trainer"]), checkpoint
        )
        members = getattr(trainer, "member_trainers", [])
        for member, saved in zip(members, state["members"]):
            training_state.restore_state(
                member, training_state.TrainingState(**saved), checkpoint
            )
        kind = type(self.dataset)  # the run's (patched scripts save its env_id)
        opened = open_preferences(
            checkpoint,
            kind if issubclass(kind, PreferenceDataset) else PreferenceDataset,
        )
        if opened is not None:
            self.dataset, self._store = opened
        agent = self._agent()
        iteration = int(state["iteration"])
        if agent is not None:
            seed = run_state.restore_agent_and_environments(
                checkpoint,
                agent,
                self._shared(),
                run_state.derived_seed(self.checkpointing.seed, iteration),
            )
            if seed is not None:
                self.logger.warn(
                    f"{where} holds no environments (they could not be saved): "
                    f"they restart from reset with seed {seed} (derived from the "
                    f"run's seed {self.checkpointing.seed} and iteration {iteration})"
                )
        exploring = state["exploring"]
        wrapper = getattr(self.trajectory_generator, "exploration_wrapper", None)
        if wrapper is not None and exploring is not None:
            wrapper.current_policy = (
                wrapper._random_policy if exploring else wrapper.wrapped_policy
            )
        run_state.restore_generators(self._generators(), state["generators"], where)
        self._iteration = iteration
        loss, accuracy = state["results"]
        self._results = (loss, accuracy)
        self.logger.log(f"Resumed from {checkpoint} after iteration {self._iteration}")


def open_preferences(
    checkpoint: pathlib.Path,
    dataset_cls: Type[PreferenceDataset] = PreferenceDataset,
) -> Optional[Tuple[PreferenceDataset, frame_store.Appender]]:
    """The preference dataset (a ``dataset_cls``) as ``checkpoint`` holds it; its store.

    Memory-mapped and read-only; every byte the checkpoint commits is hashed and
    checked. Nothing is written: bytes after the committed ones (of a run stopped
    after this checkpoint) are cut off by the store's next append.

    Returns:
        ``None`` if the checkpoint holds no pairs.

    Raises:
        imitation_accum.io.frame_store.StoreError: naming the file, if a store file
            is missing, truncated or corrupt.
    """
    source = f"{checkpoint / run_checkpoint.MANIFEST} (metadata.{_PREFERENCES})"
    record = run_checkpoint.recorded(checkpoint).get("metadata", {}).get(_PREFERENCES)
    if record is None:
        return None
    name = record.get("store") if isinstance(record, dict) else None
    if not (isinstance(name, str) and name.startswith(f"{_PREFERENCES}.")):
        raise frame_store.StoreError(f"{source}: store {name!r} is not a store's name")
    if pathlib.PurePath(name).name != name or name in (".", ".."):
        raise frame_store.StoreError(f"{source}: store {name!r} is not a plain name")
    return dataset_cls.open_committed(
        checkpoint.parent / name, record.get("manifest"), source
    )
