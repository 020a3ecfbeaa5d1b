"""``imitation_accum.checkpoint``: files of a run, kept at this path.

Safe loading, atomic writes and the training state live in
:mod:`imitation_accum.io`.
"""

from imitation_accum.io.atomic import (
    TEMPORARY_SUFFIX,
    AnyPath,
    atomic_save,
    remove_stale_temporaries,
)
from imitation_accum.io.safe_loading import (
    SafeGlobal,
    allowing_reward_nets,
    default_safe_globals,
    load_reward_net,
    register_safe_classes,
    save_reward_net,
    unsafe_globals,
)
from imitation_accum.io.training_state import (
    TRAINING_STATE_NAME,
    TrainingState,
    apply_hyperparameters,
    capture_state,
    check_fits,
    load_training_state,
    restore_state,
    save_training_state,
)

__all__ = [
    "TEMPORARY_SUFFIX",
    "TRAINING_STATE_NAME",
    "AnyPath",
    "SafeGlobal",
    "TrainingState",
    "allowing_reward_nets",
    "apply_hyperparameters",
    "atomic_save",
    "capture_state",
    "check_fits",
    "default_safe_globals",
    "load_reward_net",
    "load_training_state",
    "register_safe_classes",
    "remove_stale_temporaries",
    "restore_state",
    "save_reward_net",
    "save_training_state",
    "unsafe_globals",
]
