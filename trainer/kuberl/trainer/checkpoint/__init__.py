"""Checkpoints: the files (crash-safe, verified), the folder a run holds (owner lock, storage checks), the shards
every rank writes, saving and resuming a run from the driver, and export to a Hugging Face folder with a model card."""
