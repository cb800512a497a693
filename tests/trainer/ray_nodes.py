"""A real multi-node Ray cluster on this machine, the way the RayJob's pods make one: a head (``ray start --head``,
labelled as the trainer pool) and rollout nodes (``ray start --address …`` labelled ``kuberl.io/pool=rollout``),
each a process tree of its own that a test starts, and stops the way a pod goes: SIGKILL of every process of the
node, raylet and workers together.

The GCS declares a node dead after ``health_check_failure_threshold`` missed checks; the head runs with short
checks (a lost node is seen within about 10 s, not Ray's default half minute), each allowed 2 s on a loaded machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e2e.harness import free_port
from e2e.raypods import RAY_ENV, process_tree
from kuberl.api.contract import POOL_LABEL, ROLLOUT_POOL, TRAINER_POOL

HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}
ENV = {**RAY_ENV, **HEALTH_CHECKS}
RAY = Path(sys.executable).parent / "ray"
OBJECT_STORE_BYTES = (
    256 * 2**20
)  # per node: the tiny policy's weights, many times over (Ray's default is 30% of memory)


def auth_env() -> dict[str, str]:
    """The cluster's auth mode: this process's. A local ``ray.init()`` earlier in the process (another test module's)
    switched it to token auth, Ray's default for a new local cluster (``RAY_AUTH_MODE=token``, the token in
    ``~/.ray/auth_token``), and Ray keeps that cached; a cluster without auth would have its calls to the driver
    refused and the driver's actors cancelled ("all references to the actor were removed"). Otherwise: no auth."""
    return {"RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}


class RayNodes:
    """The cluster's node processes: :meth:`add_rollout_node`, :meth:`kill`, :meth:`close`."""

    def __init__(self, *, head_cpus: int = 2) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix="krl-ray-")
        self.env = {**os.environ, **ENV, **auth_env()}
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.head = self.start(
            "--head",
            f"--port={self.port}",
            f"--temp-dir={self.temp_dir}",
            "--include-dashboard=false",
            f"--num-cpus={head_cpus}",
            f"--labels={POOL_LABEL}={TRAINER_POOL}",
        )

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        """A node with ports of its own: the defaults of Ray's agents and metrics are fixed numbers, which a second
        node on the same machine would fail to bind."""
        ports = [
            f"--{name}={free_port()}"
            for name in (
                "node-manager-port",
                "object-manager-port",
                "metrics-export-port",
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "runtime-env-agent-port",
            )
        ]
        command = [str(RAY), "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *ports]
        command += [f"--object-store-memory={OBJECT_STORE_BYTES}", *args]
        with open(Path(self.temp_dir) / f"node-{len(self.nodes)}.log", "wb") as log:
            node = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.nodes.append(node)
        return node

    def started(self, node: subprocess.Popen[bytes], timeout: float = 300) -> bool:
        """Whether ``node``'s ``ray start`` says its runtime started (False: it exited first)."""
        log = Path(self.temp_dir) / f"node-{self.nodes.index(node)}.log"
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in log.read_bytes():
            if node.poll() is not None:
                return False
            assert time.monotonic() < deadline, f"ray start did not finish within {timeout:.0f} s"
            time.sleep(0.5)
        return True

    def add_rollout_node(self, cpus: int = 1) -> subprocess.Popen[bytes]:
        """One rollout pod: a node of ``cpus`` CPUs (one: one CPU engine) labelled as the rollout pool, with a temp
        dir of its own as a pod has. Nodes that share one pick their sockets' names by what the folder holds, so two
        starting together may pick the same one; the raylet that loses fails to bind and its node never comes up."""
        temp_dir = Path(self.temp_dir) / f"node-{len(self.nodes)}"
        return self.start(
            f"--address={self.address}",
            f"--temp-dir={temp_dir}",
            f"--num-cpus={cpus}",
            f"--labels={POOL_LABEL}={ROLLOUT_POOL}",
        )

    def kill(self, node: subprocess.Popen[bytes]) -> None:
        """The pod is gone: every process of the node gets SIGKILL at once."""
        for pid in process_tree(node.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        node.wait()

    def close(self) -> None:
        for node in reversed(self.nodes):
            if node.poll() is None:
                self.kill(node)


def alive_rollout_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive") and (n.get("Labels") or {}).get(POOL_LABEL) == ROLLOUT_POOL)


def wait_until(condition, what: str, timeout: float = 180) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.5)
