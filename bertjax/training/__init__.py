"""Training: train state, losses and steps, loop, schedules, checkpoints, stacking
(sharded through `bertjax.mesh`)."""
