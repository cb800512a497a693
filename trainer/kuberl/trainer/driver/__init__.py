"""The driver: the RL loop (:class:`~kuberl.trainer.driver.trainer.Trainer`), what it starts on Ray, and how its
failures are classified."""
