"""What a run reports: metrics sinks and timers, the RLJob status and Events, plots of a finished run."""
