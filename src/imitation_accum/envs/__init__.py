"""Environments: Atari with SB3's preprocessing."""
