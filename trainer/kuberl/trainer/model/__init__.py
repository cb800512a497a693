"""The policy and value models on a rank: loading from every model source, FSDP2 wrapping, packed rows and
micro-batches, attention over packed rows, and log-probs through the output head."""
