"""``train_reward_model``'s ``regularizer`` config as imitation's regularizers.

The keys are checked by :func:`~imitation_accum.scripts.config_checks.check_regularizer`
before anything is built.
"""

from typing import Any, Mapping, Optional

from imitation.regularization import regularizers, updaters


def regularizer_factory(
    config: Mapping[str, Any],
) -> Optional[regularizers.RegularizerFactory]:
    """Imitation's regularizer factory for a checked ``regularizer`` config.

    Args:
        config: The section (``kind``, ``initial_lambda``, ``p``,
            ``scaling_factor``, ``tolerable_interval``, ``val_split``).

    Returns:
        An ``LpRegularizer`` or ``WeightDecayRegularizer`` factory, with an
        ``IntervalParamScaler`` when ``scaling_factor`` is set; ``None`` when
        ``kind`` is ``None``.
    """
    kind = config["kind"]
    if kind is None:
        return None
    updater = None
    val_split = None
    if config["scaling_factor"] is not None:
        updater = updaters.IntervalParamScaler(
            config["scaling_factor"],
            tuple(config["tolerable_interval"]),
        )
        val_split = float(config["val_split"])
    if kind == "lp":
        return regularizers.LpRegularizer.create(
            config["initial_lambda"],
            updater,
            val_split=val_split,  # type: ignore[arg-type]
            p=config["p"],
        )
    return regularizers.WeightDecayRegularizer.create(
        config["initial_lambda"],
        updater,
        val_split=val_split,  # type: ignore[arg-type]
    )
