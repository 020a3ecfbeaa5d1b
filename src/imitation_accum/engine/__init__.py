"""The accumulation engine: one optimizer step over the chunks of a batch.

A task (:mod:`imitation_accum.engine.task`) says what a chunk computes; the
accumulator (:mod:`imitation_accum.engine.accumulator`) runs the chunks of a step
plan in one or two passes, replays norm statistics, forks the RNG, applies the
precision settings, and steps once per batch.
"""
