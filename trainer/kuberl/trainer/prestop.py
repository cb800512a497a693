"""The Ray pods' preStop hooks: a suspended, preempted or drained RLJob saves a checkpoint before its Ray cluster dies.

    python -m kuberl.trainer.prestop head --timeout 600 --dashboard http://127.0.0.1:8265
    python -m kuberl.trainer.prestop worker --timeout 600

KubeRay suspends a RayJob (and Kueue preempts one) by deleting its Ray cluster, without stopping the Ray job. The
kubelet runs a container's preStop hook before it sends SIGTERM to the container's `ray start` (PID 1), which takes
the job's driver and actors down with it; the hook's time counts against the pod's terminationGracePeriodSeconds.
- head: stop the jobs still running on the head's own dashboard: Ray's job supervisor sends the driver SIGTERM (and
  SIGKILL only after RAY_JOB_STOP_WAIT_TIME_S, which the operator sets to the grace period), the trainer finishes
  its step, saves a checkpoint and exits; wait until every job is over.
- worker: wait while the head still runs a job, so that this pod's raylet, and the ranks' actors on it, stay up
  while they write their shards; done when no job runs or the head stops answering (it is gone).
Both give up at `--timeout` (the grace period): the kubelet kills the container then anyway.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from kuberl.api.contract import DASHBOARD_PORT, ENV_RAY_AUTH_TOKEN, HEAD_DASHBOARD, PRESTOP_MODULE

ENV_HEAD_HOST = "FQ_RAY_IP"  # KubeRay's variable on worker pods: the head Service's fully qualified name
POLL_SECONDS = 1.0


def _client(dashboard: str) -> Any:
    """A job client of the dashboard at `dashboard` that sends the Ray token of RAY_AUTH_TOKEN (KubeRay sets it) as
    its own header: Ray's token loader reads the variable once per process and keeps it."""
    from ray.job_submission import JobSubmissionClient

    token = os.environ.get(ENV_RAY_AUTH_TOKEN)
    return JobSubmissionClient(dashboard, headers={"Authorization": f"Bearer {token}"} if token else None)


def _running(client: Any) -> list[str]:
    """Submission ids of the jobs that are not over (a job without one cannot be stopped by id, nor run by KubeRay)."""
    return [job.submission_id for job in client.list_jobs() if not job.status.is_terminal() and job.submission_id]


def stop_jobs(dashboard: str, timeout: float) -> list[str]:
    """Stop every job running on the head at `dashboard` and wait until each is over. Returns the ids still running
    at the deadline (empty: all stopped)."""
    deadline = time.monotonic() + timeout
    client = _client(dashboard)
    jobs = _running(client)
    for job in jobs:
        client.stop_job(job)
        _say(f"stopping Ray job {job}: its driver gets SIGTERM, saves a checkpoint and exits")
    while jobs and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        jobs = [job for job in jobs if not client.get_job_status(job).is_terminal()]
    for job in jobs:
        _say(f"Ray job {job} still running after {timeout:g} s (the pod's grace period): it is killed with the pod")
    return jobs


def wait_for_head(dashboard: str, timeout: float) -> bool:
    """Wait while the head at `dashboard` runs a job. True when none runs or the head is gone, False at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if not _running(_client(dashboard)):
                return True
        except (OSError, RuntimeError):  # ConnectionError (no dashboard), or an answer that is not a job list
            return True
        if time.monotonic() >= deadline:
            _say(f"the Ray head still runs a job after {timeout:g} s (the pod's grace period)")
            return False
        time.sleep(POLL_SECONDS)


def _say(message: str) -> None:
    print(f"kuberl preStop: {message}", file=sys.stderr, flush=True)


def _worker_dashboard() -> str:
    host = os.environ.get(ENV_HEAD_HOST)
    if not host:
        raise SystemExit(f"kuberl preStop worker: {ENV_HEAD_HOST} is not set (KubeRay sets it); pass --dashboard")
    return f"http://{host}:{DASHBOARD_PORT}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The hook's flags (kuberl.api.contract.prestop_command writes them)."""
    parser = argparse.ArgumentParser(prog=f"python -m {PRESTOP_MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("head", "worker"))
    parser.add_argument("--timeout", type=float, required=True, help="seconds: the pod's grace period")
    parser.add_argument("--dashboard", help=f"the head's dashboard (head: {HEAD_DASHBOARD}; worker: from FQ_RAY_IP)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "head":
        return 1 if stop_jobs(args.dashboard or HEAD_DASHBOARD, args.timeout) else 0
    return 0 if wait_for_head(args.dashboard or _worker_dashboard(), args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
