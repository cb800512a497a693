"""What this machine lets the sandbox enforce, found out at start-up by running a real probe program in a jail.

Namespaces are tried first (`Mode.ROOT` for a root server, `Mode.USER` for any other): the probe must find itself without
network, without the server's files and, under root, under another uid. Where namespaces are refused (a
Kubernetes pod: its RuntimeDefault seccomp profile forbids unshare), `Mode.PROCESS` is accepted only if the
network is already out of reach: no network interface but loopback, or, in a pod, the apiserver unreachable (the
pool's NetworkPolicy admits no egress and the cluster's network plugin enforces it). Otherwise the sandbox
refuses to start: a sandbox that silently runs programs with network is worse than none (docs/security.md).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import dataclass
from typing import Literal

from kuberl.sandbox.executor import Executor
from kuberl.sandbox.jail import Mode
from kuberl.sandbox.protocol import Execution, Limits, Outcome, Run

Requested = Literal["auto", "namespaces", "process"]
EGRESS_PROBE_SECONDS = 3.0  # how long the pod's probe waits for a connection to the apiserver

PROBE_PROGRAM = """
import json, os, socket, sys
marker, port = json.loads(sys.stdin.read())
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    network = "connected"
except OSError as exc:
    network = type(exc).__name__ + ": " + str(exc)
print(json.dumps({"uid": os.getuid(), "network": network, "sees_server_file": os.path.exists(marker)}))
"""


class SandboxUnavailable(RuntimeError):
    """This machine cannot enforce what the sandbox promises; the message says what is missing and what to do."""


@dataclass(frozen=True)
class Isolation:
    mode: Mode
    enforced: tuple[str, ...]  # what holds for every run, in words (the server logs it and serves it on /healthz)

    def report(self) -> str:
        return f"isolation {self.mode}: " + "; ".join(self.enforced)


def decide(requested: Requested = "auto", limits: Limits | None = None) -> Isolation:
    """The strongest isolation this machine allows, or SandboxUnavailable naming what failed."""
    limits = limits or Limits()
    failures: list[str] = []
    if requested in ("auto", "namespaces"):
        # A root server's programs run as another uid; in a user namespace they would keep the server's (root's)
        mode = Mode.ROOT if os.geteuid() == 0 else Mode.USER
        try:
            return _probe_namespaces(mode, limits)
        except SandboxUnavailable as exc:
            failures.append(str(exc))
    if requested in ("auto", "process"):
        try:
            return _probe_process()
        except SandboxUnavailable as exc:
            failures.append(str(exc))
    raise SandboxUnavailable(
        "the sandbox cannot isolate programs here: "
        + "; ".join(failures)
        + ". Run it as root or where unprivileged user namespaces are allowed (sysctl kernel.unprivileged_userns_clone=1,"
        " user.max_user_namespaces > 0), or in the RLJob's sandbox pool on Kubernetes"
    )


def _probe_namespaces(mode: Mode, limits: Limits) -> Isolation:
    """Run the probe program in a jail of `mode` and check what it could reach."""
    with tempfile.TemporaryDirectory(prefix="kuberl-probe-") as directory, socket.socket() as listener:
        marker = os.path.join(directory, "server-file")
        open(marker, "w").close()
        os.chmod(directory, 0o755)
        os.chmod(marker, 0o644)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        where = json.dumps([marker, listener.getsockname()[1]])
        executor = Executor(limits, 1, mode)
        try:
            result = executor.execute(Execution(PROBE_PROGRAM, (Run(stdin=where),)))
        finally:
            executor.close()
    run = result.runs[0]
    if run.outcome is not Outcome.OK:
        raise SandboxUnavailable(f"{mode} namespaces: {result.error or run.outcome + ': ' + run.stderr.strip()[-500:]}")
    seen = json.loads(run.stdout)
    if seen["network"] == "connected" or seen["sees_server_file"] or (mode is Mode.ROOT and seen["uid"] == 0):
        raise SandboxUnavailable(f"{mode} namespaces did not isolate the probe program: {seen}")
    identity = (
        f"uid {seen['uid']} per slot (not root)" if mode is Mode.ROOT else "the server's uid without capabilities"
    )
    return Isolation(
        mode,
        (
            "rlimits on CPU time, address space, processes, file size and open files; wall-clock kill",
            f"network: a namespace of its own ({seen['network']})",
            "filesystem: the interpreter and /usr read-only, a private tmpfs working directory",
            "processes: a pid namespace of its own; the server and other executions are invisible",
            f"identity: {identity}, no new privileges",
        ),
    )


def _probe_process() -> Isolation:
    """Without namespaces: accept only a network that is already unreachable."""
    interfaces = sorted(name for _, name in socket.if_nameindex() if name != "lo")
    if not interfaces:
        network = "no network interface but loopback"
    else:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise SandboxUnavailable(
                f"without namespaces nothing keeps programs off the network (interfaces {', '.join(interfaces)}, and "
                "no Kubernetes NetworkPolicy to rely on)"
            )
        try:
            socket.create_connection((host, int(port)), timeout=EGRESS_PROBE_SECONDS).close()
        except OSError as exc:
            network = f"egress blocked by the pool's NetworkPolicy (the apiserver {host}:{port}: {exc or 'timed out'})"
        else:
            raise SandboxUnavailable(
                f"the apiserver {host}:{port} is reachable from the sandbox pod: the cluster's network plugin does "
                "not enforce the pool's NetworkPolicy, so programs would have network"
            )
    return Isolation(
        Mode.PROCESS,
        (
            "rlimits on CPU time, address space, processes, file size and open files; wall-clock kill",
            f"network: {network}",
            "filesystem: the pod's (read-only root, no service-account token); executions share the pod's uid",
            "processes: a session per run and a subreaper that kills escaped descendants; pid 1 survives programs",
        ),
    )
