"""Sacred experiments training with this package's trainers, and their presets.

``python -m imitation_accum.scripts.{train_preference_comparisons,train_adversarial,
train_reward_model} with ...``: see each module. ``python -m
imitation_accum.scripts.parallel``: Ray Tune sweeps of them (needs the ``ray`` extra).
"""
