"""The trainer: a step's phases (trainer.py), its config and recipes, evaluation, the ETA, checkpoints and the run
directory, data parallelism, and the SFT starts."""
