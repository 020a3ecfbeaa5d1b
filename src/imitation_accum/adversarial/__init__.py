"""AIRL and GAIL whose discriminator update is accumulated exactly."""

from imitation_accum.adversarial.arguments import resolve_minibatch_size
from imitation_accum.adversarial.trainers import AIRL, GAIL

__all__ = ["AIRL", "GAIL", "resolve_minibatch_size"]
