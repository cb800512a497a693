"""The experience stage: a batch of prompts in, a typed :class:`~kuberl.trainer.experience.batch.Experience` out
(generation, scoring, the reference and critic passes, advantages)."""
