"""Where a run's numbers and warnings go: the metrics sinks (console, metrics.jsonl, Prometheus, TensorBoard,
W&B), the RLJob's ``status.progress`` and its Events (on Kubernetes), and console lines that keep clear of the
progress bar."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kuberl.api import RLJobSpec
from kuberl.api.status import Progress
from kuberl.trainer.observe.metrics import MetricsLogger
from kuberl.trainer.observe.status import StatusReporter


def write(line: str) -> None:
    """A console line above the progress bar (tqdm's, when one is shown)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)


def progress_bar(name: str, *, total: int, initial: int, show: bool) -> Any:
    """The run's step bar on stderr; shown only on a terminal (in a log file it interleaves with the steps)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=name,
        unit="step",
        disable=not (show and sys.stderr.isatty()),
        file=sys.stderr,
        dynamic_ncols=True,
    )


class Reporting:
    """One run's metrics sinks and RLJob status reporter, opened together and closed together."""

    def __init__(self, spec: RLJobSpec, *, rljob: str, namespace: str, run_dir: Path, total_steps: int) -> None:
        self.total_steps = total_steps
        self.metrics = MetricsLogger(
            run_dir,
            loggers=spec.trainer.loggers,
            rljob=rljob,
            namespace=namespace,
            metrics_port=spec.trainer.metrics_port,
            total_steps=total_steps,
            write=write,
            # no environment value reaches a logger's config (wandb, tensorboard): they may hold credentials
            config=spec.model_dump(mode="json", by_alias=True, exclude={"cluster": {"env"}}),
        )
        self.status = StatusReporter.from_env(rljob, namespace)
        """None outside Kubernetes (no status to report to)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics.log(step, metrics)

    def progress(self, step: int, metrics: dict[str, float], *, last_checkpoint: str | None, force: bool) -> None:
        """The step's progress into the RLJob status (rate-limited unless ``force``)."""
        if self.status is None:
            return
        step_time = metrics.get("perf/time_per_step") or 0.0
        self.status.report(
            Progress(
                step=step,
                total_steps=self.total_steps,
                epoch=int(metrics.get("training/epoch", 0)),
                reward_mean=metrics.get("critic/score/mean"),
                last_checkpoint=last_checkpoint,
                tokens_per_second=metrics["perf/total_num_tokens"] / step_time if step_time else None,
                rollout_engines=int(metrics["rollout/engines"]) if "rollout/engines" in metrics else None,
            ),
            force=force,
        )

    def rollout_engines(self, count: int) -> None:
        """The separate rollout's active engines changed: into the RLJob status at once (between steps too, e.g.
        while the trainer waits with none)."""
        if self.status is not None:
            self.status.report_engines(count)

    def warn(self, reason: str, message: str) -> None:
        """A warning on the console and, on Kubernetes, a Warning Event on the RLJob."""
        write(f"warning: {message}")
        if self.status is not None:
            self.status.event(reason, message)

    def close(self) -> None:
        self.metrics.close()
