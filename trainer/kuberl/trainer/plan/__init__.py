"""The run's derived decisions, made once on the driver from the spec and the Ray cluster and handed to every
process: micro-batching per role, the rollout layout, the engine's arguments, resource shares."""
