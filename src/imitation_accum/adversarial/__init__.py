"""AIRL and GAIL whose discriminator update is accumulated exactly."""

from imitation_accum.adversarial.arguments import (
    policy_observations,
    resolve_minibatch_size,
)
from imitation_accum.adversarial.trainers import AIRL, GAIL

__all__ = ["AIRL", "GAIL", "policy_observations", "resolve_minibatch_size"]
