"""Reward functions (builtin and user), how a batch is scored within its timeout, the reward process, and reward
models."""
