"""A step's batch before the update: generation, scoring and dynamic sampling (:mod:`.collect`), the next batch
generated during the update (:mod:`.overlap`), and the step's metrics."""
