"""``imitation_accum.reward_nets``: kept at this path for saved reward nets.

Nets pickled by earlier versions name their class here; the code lives in
:mod:`imitation_accum.nets.shaped`.
"""

from imitation_accum.nets.shaped import CnnShapedRewardNet

__all__ = ["CnnShapedRewardNet"]
