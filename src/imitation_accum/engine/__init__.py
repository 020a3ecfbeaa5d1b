"""The accumulation engine: one optimizer step over the chunks of a batch."""
