"""The RLJob's sandbox pools as this run reaches them, announced to the driver and the processes it starts.

On Kubernetes a pool is the operator's Service (:func:`kuberl.api.contract.sandbox_url`). ``kuberl run`` is given a
pool's address (``--sandbox POOL=ADDRESS``) or starts a local server for it: ``python -m kuberl.sandbox serve`` on a
Unix socket in a private folder, with the pool's limits and executions at once, in namespaces where this machine
allows them (the server refuses to start where it cannot keep programs off the network: docs/security.md). It is
stopped when the run ends, and by the kernel when the run is killed (``--parent``).

Either way every pool is announced in the environment (:func:`kuberl.sandbox.client.pool_variable`), where the
``code_tests`` reward in the driver, the ``python`` tool in the tool workers and a custom reward function in its
process find it (:func:`kuberl.sandbox.client.job_sandbox`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from http.client import HTTPException
from pathlib import Path

from kuberl.api.contract import SANDBOX_MODULE, sandbox_url
from kuberl.api.spec import RLJobSpec, Sandbox
from kuberl.sandbox.client import PoolAddress, SandboxClient, announcement

START_SECONDS = 120.0
"""How long a local server may take to answer: it imports kuberl.api and proves its isolation with a probe program."""
STOP_SECONDS = 10.0
"""How long a local server may take to stop after SIGTERM before it is killed."""
LOG_TAIL_CHARS = 2000


class LocalSandboxError(RuntimeError):
    """A local sandbox server of ``kuberl run`` did not start; the message has the end of its log."""


def concurrency(sandbox: Sandbox) -> int:
    """Executions the pool runs at once."""
    return sandbox.replicas * sandbox.executions_per_pod


def service_addresses(name: str, namespace: str, spec: RLJobSpec) -> dict[str, str]:
    """Each pool's Service, as the RayJob's entrypoint reaches it."""
    return {role: sandbox_url(name, namespace, role) for role in spec.sandbox_pools}


@contextlib.contextmanager
def announced_pools(spec: RLJobSpec, addresses: Mapping[str, str], run_dir: Path) -> Iterator[dict[str, PoolAddress]]:
    """Announce every pool of ``spec`` for the block: at ``addresses[pool]`` when given, else a local server started
    here (its log: ``run_dir/sandbox-<pool>.log``) and stopped after the block. The environment is restored."""
    with contextlib.ExitStack() as stack:
        announced: dict[str, PoolAddress] = {}
        variables: dict[str, str] = {}
        for role, sandbox in spec.sandbox_pools.items():
            if role in addresses:
                announced[role] = PoolAddress(addresses[role], concurrency(sandbox))
            else:
                announced[role] = stack.enter_context(local_server(role, sandbox, run_dir))
            variables.update(announcement(role, announced[role]))
        stack.enter_context(environment(variables))
        yield announced


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """``variables`` set in this process's environment for the block, the previous values back after it."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def local_server(role: str, sandbox: Sandbox, run_dir: Path) -> Iterator[PoolAddress]:
    """A sandbox server of pool ``role`` for the block, on a Unix socket in a folder only this uid may enter."""
    folder = Path(tempfile.mkdtemp(prefix=f"kuberl-sandbox-{role}-"))
    where = PoolAddress(f"unix:{folder / 'server.sock'}", concurrency(sandbox))
    log_path = run_dir / f"sandbox-{role}.log"
    command = [sys.executable, "-m", SANDBOX_MODULE, "serve", "--listen", where.address]
    command += ["--executions", str(where.concurrency), "--limits", sandbox.execution.model_dump_json(by_alias=True)]
    command += ["--parent", str(os.getpid())]
    with open(log_path, "ab") as log:
        # a session of its own: a terminal's Ctrl-C stops the trainer, which finishes its step with the sandbox up
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        wait_until_serving(server, where, role, log_path)
        yield where
    finally:
        stop(server)
        shutil.rmtree(folder, ignore_errors=True)


def wait_until_serving(server: subprocess.Popen[bytes], where: PoolAddress, role: str, log_path: Path) -> None:
    client = SandboxClient(where.address, where.concurrency, request_seconds=5)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise LocalSandboxError(
                f"the local sandbox server of the {role} pool exited with status {server.returncode}: "
                f"{log_path.read_text(errors='replace')[-LOG_TAIL_CHARS:].strip()} (log: {log_path})"
            )
        with contextlib.suppress(OSError, HTTPException, ValueError):  # not listening yet, or not answering yet
            client.health()
            return
        time.sleep(0.2)
    raise LocalSandboxError(
        f"the local sandbox server of the {role} pool did not answer within {START_SECONDS:g} s (log: {log_path})"
    )


def stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server closes its executor), SIGKILL after STOP_SECONDS."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
