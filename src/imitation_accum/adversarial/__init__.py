"""AIRL and GAIL whose discriminator update is accumulated exactly."""

from imitation_accum.adversarial.algorithms import AIRL, GAIL
from imitation_accum.adversarial.arguments import (
    policy_observations,
    resolve_minibatch_size,
)

__all__ = ["AIRL", "GAIL", "policy_observations", "resolve_minibatch_size"]
