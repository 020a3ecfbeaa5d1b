"""``imitation_accum.demonstrations``: kept at this path for code and commands.

``python -m imitation_accum.demonstrations`` runs the same command line as
``python -m imitation_accum.integrations.demonstrations``, where the code lives.
"""

from imitation_accum.integrations.demonstrations import (
    TrajectoryDatasetSequence,
    main,
    make_demonstrations,
    rollout_demonstrations,
)

__all__ = [
    "TrajectoryDatasetSequence",
    "main",
    "make_demonstrations",
    "rollout_demonstrations",
]

if __name__ == "__main__":  # pragma: no cover
    main()
