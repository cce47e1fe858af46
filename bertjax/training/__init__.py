"""Training: train state, losses and steps, loop, schedules, checkpoints, stacking, sharding."""
