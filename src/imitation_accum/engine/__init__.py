"""The accumulation engine: one optimizer step over the chunks of a batch.

The accumulator (:mod:`imitation_accum.engine.accumulator`) defines what a task
computes for a chunk and runs the chunks of a step plan in one or two passes,
replays norm statistics (:mod:`imitation_accum.engine.norm_replay`), forks the RNG,
applies the precision settings, and steps once per batch.
"""
