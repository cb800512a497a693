"""How the trainer runs programs: one interface over the sandbox pool (HTTP) and the local runner (an Executor).

`execute_all` runs a batch with as many executions in flight as the sandbox runs at once, so a batch of 256
responses costs about 256 / (replicas × executionsPerPod) execution times.

The trainer's entrypoint announces each of the RLJob's pools to the driver and the processes it starts (the reward
function's, the tool workers) in an environment variable (`pool_variable`, `PoolAddress`); `job_sandbox` connects to
one. Standard library only: the tool workers import this module and must start fast.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Protocol

from kuberl.sandbox.protocol import Execution, ExecutionResult

RETRY_SECONDS = 120.0  # how long a request is retried while the pool is busy, restarting or unreachable
CONNECT_SECONDS = 10.0


class Sandbox(Protocol):
    """Anything that runs an execution: `kuberl.sandbox.executor.Executor`, `SandboxClient`."""

    @property
    def concurrency(self) -> int: ...

    def execute(self, execution: Execution) -> ExecutionResult: ...


class SandboxUnreachable(RuntimeError):
    """The sandbox pool did not answer within RETRY_SECONDS (its pods are not ready, or it is gone)."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class SandboxClient:
    """A sandbox server (`http://HOST:PORT`, e.g. the pool's Service, or `unix:PATH`) that runs `concurrency`
    executions at once; a request it answers busy (503) or cannot take (connection refused, reset) is retried."""

    def __init__(self, address: str, concurrency: int, request_seconds: float) -> None:
        self.address = address
        self.concurrency = concurrency
        self.request_seconds = request_seconds  # the longest an answered execution may take (all runs at their limit)

    def _connection(self) -> http.client.HTTPConnection:
        if self.address.startswith("unix:"):
            return _UnixConnection(self.address.removeprefix("unix:"), self.request_seconds)
        host = self.address.removeprefix("http://").rstrip("/")
        return http.client.HTTPConnection(host, timeout=self.request_seconds)

    def execute(self, execution: Execution) -> ExecutionResult:
        body = json.dumps(execution.to_wire()).encode()
        deadline = time.monotonic() + RETRY_SECONDS
        delay = 0.05
        while True:
            problem = self._attempt(body)
            if isinstance(problem, ExecutionResult):
                return problem
            if time.monotonic() + delay > deadline:
                raise SandboxUnreachable(
                    f"the sandbox at {self.address} did not run an execution in {RETRY_SECONDS:.0f} s: {problem}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _attempt(self, body: bytes) -> ExecutionResult | str:
        """The result, or why to try again."""
        connection = self._connection()
        try:
            connection.request("POST", "/execute", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()
        if response.status == 503:
            return "busy"
        if response.status != 200:
            raise RuntimeError(f"the sandbox at {self.address} refused an execution: {response.status} {data[:500]!r}")
        return ExecutionResult.from_wire(json.loads(data))

    def health(self) -> dict[str, object]:
        connection = self._connection()
        try:
            connection.request("GET", "/healthz")
            health: dict[str, object] = json.loads(connection.getresponse().read())
            return health
        finally:
            connection.close()


def execute_all(
    sandbox: Sandbox, executions: Sequence[Execution], timeout: float | None = None
) -> list[ExecutionResult]:
    """Every execution's result, in order, with `sandbox.concurrency` in flight; TimeoutError when they are not all
    done within `timeout` seconds (those still waiting are not sent, those running end on their own)."""
    if not executions:
        return []
    pool = ThreadPoolExecutor(max_workers=min(sandbox.concurrency, len(executions)))
    futures = [pool.submit(sandbox.execute, execution) for execution in executions]
    done, pending = wait(futures, timeout)
    pool.shutdown(wait=False, cancel_futures=True)
    if pending:
        raise TimeoutError(f"{len(done)} of {len(futures)} executions finished within {timeout:g} s")
    return [future.result() for future in futures]


@dataclass(frozen=True)
class PoolAddress:
    """Where one of the RLJob's sandbox pools answers, and how many executions it runs at once."""

    address: str  # http://HOST:PORT (the pool's Service) or unix:PATH (a local server of `kuberl run`)
    concurrency: int  # replicas × executionsPerPod


def pool_variable(pool: str) -> str:
    """The environment variable holding pool `pool`'s PoolAddress as JSON (pool: kuberl.api.contract.SANDBOX_REWARD
    or SANDBOX_TOOLS)."""
    return f"KUBERL_SANDBOX_{pool.upper()}"


def announcement(pool: str, where: PoolAddress) -> dict[str, str]:
    """The environment that announces `where` as pool `pool`."""
    return {pool_variable(pool): json.dumps(asdict(where))}


def job_sandbox(pool: str, request_seconds: float) -> SandboxClient:
    """A client of the RLJob's pool `pool` as the trainer's entrypoint announced it; LookupError when it did not
    (the RLJob declares no such pool)."""
    variable = pool_variable(pool)
    announced = os.environ.get(variable)
    if announced is None:
        raise LookupError(
            f"this process has no sandbox pool {pool!r} ({variable} is not set): declare it in the RLJob "
            "(reward.sandbox for the reward, rollout.agent.sandbox for tools) and run the job with kuberl run or on "
            "Kubernetes, which announce it"
        )
    where = PoolAddress(**json.loads(announced))
    return SandboxClient(where.address, where.concurrency, request_seconds)
