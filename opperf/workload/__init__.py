"""Stage 1: profile a reference decoder workload so every back end has a real raw profile to start from."""
