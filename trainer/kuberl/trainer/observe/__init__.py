"""What a run reports: metrics sinks (and the W&B and MLflow trackers) and timers, the RLJob status and Events, the
driver's log file on the checkpoint volume, plots of a finished run."""
