"""Planning: how each step's batch is cut into chunks and reward-net calls."""
