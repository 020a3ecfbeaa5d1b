"""AIRL and GAIL: imitation's algorithms with the accumulated discriminator update."""

from imitation.algorithms.adversarial import airl as imitation_airl
from imitation.algorithms.adversarial import gail as imitation_gail

from imitation_accum.adversarial.trainers import AccumulatingAdversarialTrainer


class AIRL(AccumulatingAdversarialTrainer, imitation_airl.AIRL):
    """Drop-in for imitation's AIRL, with an exact minibatched discriminator update.

    imitation's arguments and defaults, plus those of
    :class:`~imitation_accum.adversarial.trainers.AccumulatingAdversarialTrainer`.
    For image observations use a CNN reward net such as
    :class:`imitation_accum.reward_nets.CnnShapedRewardNet`.

    Example:
        >>> from imitation_accum import AIRL  # doctest: +SKIP
        >>> trainer = AIRL(  # doctest: +SKIP
        ...     demonstrations=transitions,
        ...     demo_batch_size=1024,
        ...     demo_minibatch_size=100,
        ...     venv=venv,
        ...     gen_algo=PPO("MlpPolicy", venv),
        ...     reward_net=BasicShapedRewardNet(
        ...         venv.observation_space, venv.action_space
        ...     ),
        ... )
        >>> trainer.train(100_000)  # doctest: +SKIP
    """

    _uses_policy_log_probs = True


class GAIL(AccumulatingAdversarialTrainer, imitation_gail.GAIL):
    """Drop-in for imitation's GAIL, with an exact minibatched discriminator update.

    As :class:`AIRL`; the generator policy's log-probabilities, which GAIL does not
    read, are not computed (imitation 1.0.1 computes and discards them).

    Example:
        >>> trainer = GAIL(  # doctest: +SKIP
        ...     demonstrations=transitions,
        ...     demo_batch_size=1024,
        ...     demo_minibatch_size=96,
        ...     venv=venv,
        ...     gen_algo=PPO("CnnPolicy", venv),
        ...     reward_net=CnnRewardNet(venv.observation_space, venv.action_space),
        ... )
    """

    _uses_policy_log_probs = False
