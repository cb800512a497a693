"""A stand-in for a sandbox pod on this machine: the server as pid 1 of a new pid namespace, in a network namespace
with nothing but a loopback device, as an unprivileged uid without capabilities or new privileges, so that unshare
is refused to it as a pod's seccomp profile refuses it, and the server takes `--isolation process` as in a pod.

What it does not stand in for: the pod's filesystem (read-only root, no token, no checkpoint volume), which the
rendering tests pin (tests/operator/test_sandbox_pool.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kuberl.api.spec import SandboxExecution
from kuberl.sandbox.client import SandboxClient
from kuberl.sandbox.jail import children_of
from kuberl.sandbox.protocol import Limits

POD_UID = 10001

# Run `"$@"` as POD_UID in the namespaces unshare made; $1/$2: a folder others cannot enter on the way to the
# interpreter and its child on that way, re-exposed through a tmpfs (the pod's image has no such folder).
_ENTER = """
set -e
mount --make-rprivate /
if [ -n "$1" ]; then
  keep=$(mktemp -d)
  mount --bind "$2" "$keep"
  mount -t tmpfs -o mode=0755 tmpfs "$1"
  mkdir -p "$2"
  mount --bind "$keep" "$2"
fi
shift 2
exec setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
"""


def hidden_ancestor(path: str) -> tuple[str, str]:
    """The first folder others cannot traverse on the way to `path`, and its child on that way ("" when none)."""
    parts = Path(path).resolve().parts
    for depth in range(1, len(parts)):
        folder = Path(*parts[: depth + 1])
        if not folder.stat().st_mode & 0o001:
            return str(folder), str(Path(*parts[: depth + 2]))
    return "", ""


def wire_limits(limits: Limits) -> str:
    spec = SandboxExecution(**limits.to_wire())
    return spec.model_dump_json(by_alias=True)


@dataclass
class Pod:
    process: subprocess.Popen[bytes]
    client: SandboxClient
    log: Path

    def stop(self) -> None:
        """SIGTERM to the server from outside its pid namespace, as the kubelet sends it; unshare exits with it."""
        for server in children_of(self.process.pid):
            os.kill(server, signal.SIGTERM)
        self.process.wait(timeout=30)


def start_pod(limits: Limits, executions: int, workdir: Path) -> Pod:
    workdir.chmod(0o755)
    os.chown(workdir, POD_UID, POD_UID)
    socket_path = workdir / "sandbox.sock"
    log = workdir / "server.log"
    blocked, child = hidden_ancestor(sys.base_prefix)
    server = [sys.executable, "-m", "kuberl.sandbox", "serve", "--listen", f"unix:{socket_path}"]
    server += ["--isolation", "process", "--executions", str(executions), "--limits", wire_limits(limits)]
    server += ["--workroot", str(workdir)]
    command = ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc"]
    command += ["sh", "-c", _ENTER.format(uid=POD_UID), "sh", blocked, child, *server]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    client = SandboxClient(f"unix:{socket_path}", executions, request_seconds=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the pod's server exited: {log.read_text()}")
        try:
            health = client.health()
            break
        except OSError:
            time.sleep(0.1)
    else:
        process.kill()
        raise RuntimeError(f"the pod's server did not answer: {log.read_text()}")
    assert health["isolation"] == "process", json.dumps(health)
    return Pod(process, client, log)
