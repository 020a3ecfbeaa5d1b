"""AIRL and GAIL whose discriminator update is accumulated exactly."""

from imitation_accum.adversarial.arguments import DiscriminatorSettings
from imitation_accum.adversarial.trainers import AIRL, GAIL

__all__ = ["AIRL", "GAIL", "DiscriminatorSettings"]
