"""The RayJob's entrypoint (``python -m kuberl.trainer.run``, :data:`kuberl.api.contract.TRAINER_MODULE`) and
``kuberl run``'s: parse the spec, train it with :class:`~kuberl.trainer.driver.trainer.Trainer`, report a failure and
exit with the code the operator reads."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kuberl.api import RLJobSpec, parse_spec
from kuberl.api.contract import (
    ENV_RLJOB_NAMESPACE,
    EXIT_PERMANENT,
    EXIT_STOPPED,
    TRAINER_MODULE,
)
from kuberl.api.status import FailureClass
from kuberl.trainer.driver.failures import classify
from kuberl.trainer.driver.trainer import Trainer
from kuberl.trainer.observe import driver_log
from kuberl.trainer.observe.status import StatusReporter
from kuberl.trainer.sandboxes import announced_pools, service_addresses


def run_job(
    name: str,
    spec: RLJobSpec,
    *,
    address: str | None = None,
    run_dir: str | None = None,
    steps: int | None = None,
    namespace: str = "default",
    show_progress: bool = True,
    sandboxes: Mapping[str, str] | None = None,
) -> int:
    """Train ``spec``; 0 when done, 130 after SIGINT and 143 after SIGTERM (checkpoint saved), 1 on failure.
    ``sandboxes``: the address of each sandbox pool given; the others are served locally for the run."""
    folder = Path(run_dir) if run_dir else Path("runs") / name
    folder.mkdir(parents=True, exist_ok=True)
    with announced_pools(spec, sandboxes or {}, folder):
        trainer = Trainer(
            name, spec, run_dir=folder, namespace=namespace, address=address, steps=steps, show_progress=show_progress
        )
        started = time.time()
        first_step: int | None = None
        try:
            trainer.setup()
            first_step = trainer.global_step
            code = trainer.fit()
        finally:
            trainer.shutdown()
    print(
        run_summary(
            name,
            folder,
            first_step or 0,
            trainer.global_step,
            trainer.total_steps,
            time.time() - started,
            trainer.last_checkpoint,
        )
    )
    if code == EXIT_STOPPED:  # exit now: Ray's exit hooks would wait a minute for a GCS that SIGTERM stopped
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run_summary(
    name: str, folder: Path, first: int, last: int, total: int, seconds: float, checkpoint: str | None
) -> str:
    """The run's last line: the steps this run trained (none when it resumed at totalSteps), where its metrics
    are, and how to get the trained policy out of the checkpoint (trainer state, not a model folder)."""
    if last == first and first >= total:
        trained = (
            f"nothing to train: resumed at step {first}, which is trainer.totalSteps ({total}); raise it, or delete "
            f"{checkpoint or 'the checkpoints'} to start over"
        )
    else:
        resumed = f" (resumed at step {first})" if first else ""
        trained = f"{last - first} steps{resumed} in {seconds:.1f} s, now at step {last} of {total}"
    lines = [f"run {name}: {trained}; metrics in {folder / 'metrics.jsonl'}"]
    if checkpoint:
        lines.append(
            f"last checkpoint {checkpoint} (trainer state); the policy as a Hugging Face folder: "
            f"kuberl export {folder} {Path('hf') / name}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The entrypoint's flags (kuberl.api.contract.entrypoint writes them); --namespace defaults to the pod's."""
    parser = argparse.ArgumentParser(prog=f"python -m {TRAINER_MODULE}", description=main.__doc__)
    parser.add_argument("--spec-file", required=True, help="the RLJob spec as JSON (or YAML), camelCase")
    parser.add_argument("--name", required=True)
    parser.add_argument("--namespace", default=os.environ.get(ENV_RLJOB_NAMESPACE, "default"))
    parser.add_argument("--address", default="auto", help='Ray address; "auto" joins the cluster this pod is in')
    parser.add_argument("--run-dir")
    parser.add_argument("--steps", type=int)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m kuberl.trainer.run --spec-file spec.json --name NAME --namespace NS`` (the RayJob entrypoint)."""
    args = parse_args(argv)
    text = Path(args.spec_file).read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        import yaml

        raw = yaml.safe_load(text)
    raw = raw.get("spec", raw) if isinstance(raw, dict) and "apiVersion" in raw else raw
    checkpoint_dir = (raw.get("trainer") or {}).get("checkpointDir") if isinstance(raw, dict) else None
    with driver_log.teed(checkpoint_dir, args.name) if checkpoint_dir else contextlib.nullcontext():
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        return _run_entrypoint(args, raw)


def _run_entrypoint(args: argparse.Namespace, raw: Any) -> int:
    """Train the entrypoint's spec; a failure is reported in status.progress.failure before it ends the attempt."""
    try:
        spec = parse_spec(raw, source=args.spec_file)
        return run_job(
            args.name,
            spec,
            address=args.address,
            run_dir=args.run_dir,
            steps=args.steps,
            namespace=args.namespace,
            show_progress=False,
            sandboxes=service_addresses(args.name, args.namespace, spec),
        )
    except Exception as exc:  # reported, then: permanent → EXIT_PERMANENT (no retry), transient → raised (exit 1)
        failure = classify(exc)
        reporter = StatusReporter.from_env(args.name, args.namespace)
        if reporter is not None:
            reporter.report_failure(failure)
        if failure.kind != FailureClass.PERMANENT:
            raise
        logging.getLogger(__name__).error("permanent failure, not retried", exc_info=exc)
        print(f"error: {failure.error}: {failure.message}", file=sys.stderr)
        return EXIT_PERMANENT


if __name__ == "__main__":
    sys.exit(main())
