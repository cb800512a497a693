"""Checkpoints: the files (crash-safe, verified), saving and resuming a run from the driver, and export to a Hugging
Face folder."""
