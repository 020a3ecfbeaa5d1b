"""Sacred experiments: imitation's, training with this package's trainers.

- ``python -m imitation_accum.scripts.train_preference_comparisons with ...``
- ``python -m imitation_accum.scripts.train_adversarial {airl,gail} with ...``

Each is imitation's experiment of the same name, with every config key and named
config, plus Atari named configs, a ``fast`` named config and early config checks.
JSON presets live in the repository's ``configs/`` folder.
"""
