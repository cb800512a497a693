"""The local runner: executions in jails, a bounded number at once.

The server wraps one in each sandbox pod; `kuberl run` uses one in the driver's process. Each execution gets a
slot: a directory (the jail's mount point, or the working directory without namespaces) and, under a root server,
a uid of its own, so that RLIMIT_NPROC (counted per uid) bounds exactly that execution's processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from kuberl.sandbox.jail import PACKAGE_ROOT, Confinement, Mode, children_of
from kuberl.sandbox.protocol import LANGUAGES, Execution, ExecutionResult, Limits

UID_BASE = 1_990_000_000
"""Slot i of a root server runs its programs as uid UID_BASE + i: far above the uids distributions and images
allocate, so no other process shares the count RLIMIT_NPROC keeps per uid."""

BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from kuberl.sandbox.jail import main; main()"
"""The jail's interpreter runs with -I -S (no environment, no site-packages): this puts kuberl.sandbox in reach."""

SETUP_SECONDS = 10.0
"""Beyond the runs' wall-clock limits, what an execution may take before the executor kills its jail: the
interpreter's start, the namespaces and mounts (about 0.05 s on an idle machine), a loaded node's delays."""

SYSTEM_DIRECTORIES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def jail_binds() -> tuple[str, ...]:
    """Host paths a program sees read-only: the system's programs and libraries, and this interpreter's
    installation (its standard library; not the virtual environment's site-packages)."""
    binds = [path for path in SYSTEM_DIRECTORIES if os.path.lexists(path)]
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == path or prefix.startswith(path + "/") for path in binds):
        binds.append(prefix)
    return tuple(binds)


class Executor:
    """Runs executions under `mode` and `limits`, at most `concurrency` at once (more wait for a slot)."""

    def __init__(self, limits: Limits, concurrency: int, mode: Mode, workroot: str | None = None) -> None:
        self.limits = limits
        self.mode = mode
        self.concurrency = concurrency
        self.root = Path(tempfile.mkdtemp(prefix="kuberl-sandbox-", dir=workroot))
        self.root.chmod(0o755)
        self._binds = jail_binds()
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(concurrency):
            (self.root / f"slot-{slot}").mkdir(mode=0o755)
            self._slots.put(slot)
        self._lock = threading.Lock()
        self._jails: set[int] = set()

    def execute(self, execution: Execution) -> ExecutionResult:
        if execution.language not in LANGUAGES:
            return ExecutionResult.failed(
                execution, f"language {execution.language!r} is not supported; use one of {', '.join(LANGUAGES)}"
            )
        slot = self._slots.get()
        try:
            return self._in_jail(slot, execution)
        finally:
            self._slots.put(slot)

    def kill_strays(self) -> int:
        """Kill and reap this process's children that are not running jails; how many there were.

        Without namespaces a program shares the server's uid and may kill its jail; the jail's other descendants
        are then re-parented to the nearest subreaper: the server, which is pid 1 of its pod (or made itself a
        subreaper). The server calls this now and then; `kuberl run`'s executor has namespaces and never needs it.
        """
        with self._lock:  # a jail is started and registered under the same lock: never mistaken for a stray
            strays = [pid for pid in children_of(os.getpid()) if pid not in self._jails]
            for pid in strays:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in strays:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        return len(strays)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def confinement(self, slot: int) -> Confinement:
        root_server = os.geteuid() == 0
        return Confinement(
            mode=self.mode,
            directory=str(self.root / f"slot-{slot}"),
            uid=UID_BASE + slot if root_server and self.mode is not Mode.USER else None,
            binds=self._binds,
        )

    def _in_jail(self, slot: int, execution: Execution) -> ExecutionResult:
        request = {
            "confinement": self.confinement(slot).to_wire(),
            "limits": self.limits.to_wire(),
            "execution": execution.to_wire(),
        }
        backstop = SETUP_SECONDS + len(execution.runs) * (self.limits.wall_seconds + 1)
        with self._lock:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", BOOT, PACKAGE_ROOT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env={},
            )
            self._jails.add(process.pid)
        try:
            try:
                out, err = process.communicate(json.dumps(request).encode(), timeout=backstop)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the jail and its supervisor: the namespace dies with them
                process.communicate()
                return ExecutionResult.failed(execution, f"the jail did not finish within {backstop:.0f} s; killed")
        finally:
            with self._lock:
                self._jails.discard(process.pid)
        try:
            return ExecutionResult.from_wire(json.loads(out))
        except (ValueError, KeyError, TypeError):
            reason = err.decode(errors="replace").strip()[-2000:] or f"exit status {process.returncode}"
            return ExecutionResult.failed(execution, f"the jail ended without a result: {reason}")
