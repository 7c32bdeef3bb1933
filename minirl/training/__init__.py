"""The parts of an RL step, as functions with explicit inputs (the loop is minirl/trainer.py): tensors and log-probs,
groups and reward shaping, pi_old and the optimizer steps, checkpoints, faults, the SFT recipe, console lines."""
