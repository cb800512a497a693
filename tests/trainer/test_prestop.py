"""The preStop hooks against a real local Ray head (`ray start --head`, its dashboard, its job supervisor): the head's
hook stops a running job, whose driver gets SIGTERM and takes longer than Ray's default 3 s to save; the worker's
hook waits until that job is over; both give up at their timeout."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from e2e.harness import free_port
from e2e.raypods import RAY_ENV, process_tree
from kuberl.api.contract import ENV_RAY_AUTH_MODE, ENV_RAY_AUTH_TOKEN, RAY_AUTH_MODE_TOKEN
from kuberl.trainer.prestop import main, stop_jobs, wait_for_head

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

SAVE_SECONDS = 5  # the driver's "save" after SIGTERM: longer than Ray's default RAY_JOB_STOP_WAIT_TIME_S (3 s)

DRIVER = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    time.sleep(float(sys.argv[2]))
    (out / "saved").write_text("saved")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
(out / "started").write_text("started")
while True:
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def dashboard() -> Iterator[str]:
    """A Ray head of its own, token-authenticated as KubeRay makes it (the hooks read the token from the environment
    as in the pods), whose job supervisor waits 60 s before SIGKILL (what the operator sets on the head)."""
    port, ray_dir = free_port(), tempfile.mkdtemp(prefix="krl-")
    auth = {ENV_RAY_AUTH_MODE: RAY_AUTH_MODE_TOKEN, ENV_RAY_AUTH_TOKEN: secrets.token_hex(16)}
    env = {**os.environ, **RAY_ENV, **auth, "RAY_JOB_STOP_WAIT_TIME_S": "60"}
    ray = Path(sys.executable).parent / "ray"
    command = [str(ray), "start", "--head", "--block", f"--port={free_port()}", f"--dashboard-port={port}"]
    command += ["--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1", "--num-cpus=1", f"--temp-dir={ray_dir}"]
    command += [f"--dashboard-agent-listen-port={free_port()}", "--include-dashboard=true"]
    head = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{port}"
    patch = pytest.MonkeyPatch()
    for key, value in auth.items():
        patch.setenv(key, value)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert head.poll() is None, "ray start --head exited"
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{address}/api/gcs_healthz", timeout=2):
                break
            assert time.monotonic() < deadline, "no Ray dashboard after 120 s"
            time.sleep(0.5)
        yield address
    finally:
        patch.undo()
        for pid in process_tree(head.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        head.wait()


def client(address: str) -> JobSubmissionClient:
    """A job client with the fixture's token as its own header (Ray's token loader keeps the first token it read in a
    process, which another test's Ray may have set)."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address, headers={"Authorization": f"Bearer {os.environ[ENV_RAY_AUTH_TOKEN]}"})


def submit(address: str, out: Path, save_seconds: float) -> str:
    out.mkdir()
    driver = out / "driver.py"
    driver.write_text(DRIVER)
    job = client(address).submit_job(entrypoint=f"{sys.executable} {driver} {out} {save_seconds}")
    deadline = time.monotonic() + 60
    while not (out / "started").exists():
        assert time.monotonic() < deadline, "the job's driver did not start"
        time.sleep(0.2)
    return str(job)


@pytest.mark.timeout(240)
def test_the_head_hook_stops_the_job_and_waits_for_its_save_while_the_worker_hook_waits(
    dashboard: str, tmp_path: Path
) -> None:
    from ray.job_submission import JobStatus

    job = submit(dashboard, tmp_path / "job", SAVE_SECONDS)
    worker_done: list[float] = []
    worker = threading.Thread(
        target=lambda: worker_done.append(time.monotonic()) if wait_for_head(dashboard, 60) else None
    )
    worker.start()
    time.sleep(2)
    assert worker.is_alive(), "the worker's hook waits while the job runs"

    started = time.monotonic()
    assert main(["head", "--timeout", "60", "--dashboard", dashboard]) == 0
    took = time.monotonic() - started
    assert (tmp_path / "job" / "saved").exists(), "the driver got SIGTERM and finished its save"
    assert took >= SAVE_SECONDS - 0.5, f"the hook returned before the save was done ({took:.1f} s)"
    assert client(dashboard).get_job_status(job) == JobStatus.STOPPED
    worker.join(timeout=30)
    assert worker_done and worker_done[0] >= started + SAVE_SECONDS - 0.5, "the worker's hook ended with the job"


@pytest.mark.timeout(240)
def test_the_hooks_give_up_at_their_timeout(dashboard: str, tmp_path: Path) -> None:
    job = submit(dashboard, tmp_path / "slow", 30)
    started = time.monotonic()
    assert not wait_for_head(dashboard, 2), "the job runs past the worker hook's timeout"
    assert stop_jobs(dashboard, 3) == [job]
    assert time.monotonic() - started < 15
    assert not (tmp_path / "slow" / "saved").exists()


def test_a_gone_head_ends_the_worker_hook_at_once() -> None:
    started = time.monotonic()
    assert wait_for_head(f"http://127.0.0.1:{free_port()}", 60)
    assert time.monotonic() - started < 10
