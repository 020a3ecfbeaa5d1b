"""Files: safe loading of reward nets, atomic writes, resumable training state."""
