"""The Ray-side trainer: rollout, rewards, advantages, losses and the training loop."""
