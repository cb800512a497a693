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
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kuberl.sandbox.jail import PACKAGE_ROOT, Confinement, Mode, children_of
from kuberl.sandbox.protocol import LANGUAGES, Execution, ExecutionResult, Limits

UID_BASE = 1_990_000_000
"""Slot i of a root server runs its programs as uid UID_BASE + i: far above the uids distributions and images
allocate, so no other process shares the count RLIMIT_NPROC keeps per uid."""

BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from kuberl.sandbox.jail import fork_server; fork_server(int(sys.argv[2]))"
"""The fork server's interpreter runs with -I -S (no environment, no site-packages): this puts kuberl.sandbox in
reach and starts serving."""

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


class ForkServer:
    """The jails' parent: one interpreter with the jail's modules imported, forking a jail per execution (a fork
    costs a millisecond, an interpreter start with these imports tens). Restarted when it dies (without
    namespaces a program shares its uid and may kill it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.process, self._channel = self._start()

    @staticmethod
    def _start() -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", BOOT, PACKAGE_ROOT, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={},
        )
        theirs.close()
        return process, ours

    def fork(self, request_fd: int, result_fd: int) -> int:
        """A new jail reading its request from `request_fd` and writing its result to `result_fd`; its pid."""
        with self._lock:
            for _ in range(2):
                try:
                    socket.send_fds(self._channel, [b"jail"], [request_fd, result_fd])
                    reply = self._channel.recv(4)
                    if len(reply) == 4:
                        return int.from_bytes(reply, "little")
                except OSError:
                    pass
                self.close()
                self.process, self._channel = self._start()
        raise RuntimeError("the sandbox's fork server died twice in a row")

    def close(self) -> None:
        self._channel.close()  # it exits when its end of the channel closes
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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
        self.forks = ForkServer()

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
        """Kill and reap this process's children but the fork server; how many there were.

        Without namespaces a program shares the server's uid and may kill its jail; the jail's other descendants
        are then re-parented to the nearest subreaper: the server, which is pid 1 of its pod (or made itself a
        subreaper). The server calls this now and then; `kuberl run`'s executor has namespaces and never needs it.
        """
        with self._lock:  # the fork server is (re)started under the same lock: never mistaken for a stray
            strays = [pid for pid in children_of(os.getpid()) if pid != self.forks.process.pid]
            for pid in strays:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in strays:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        return len(strays)

    def close(self) -> None:
        self.forks.close()
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
        request_r, request_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            with self._lock:
                jail = self.forks.fork(request_r, result_w)
        finally:
            os.close(request_r)
            os.close(result_w)
        writer = threading.Thread(target=_write_and_close, args=(request_w, json.dumps(request).encode()))
        writer.start()
        out, finished = _read_until(result_r, time.monotonic() + backstop)
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(jail, signal.SIGKILL)  # the jail and its supervisor: the namespace dies with them
        writer.join()
        if not finished:
            return ExecutionResult.failed(execution, f"the jail did not finish within {backstop:.0f} s; killed")
        try:
            return ExecutionResult.from_wire(json.loads(out))
        except (ValueError, KeyError, TypeError):
            return ExecutionResult.failed(execution, "the jail ended without a result (killed, or it crashed)")


def _write_and_close(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass  # the jail died before reading it all; its missing result says so
    finally:
        os.close(fd)


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to `fd` until every writer closed it (True), or until `deadline` (False)."""
    chunks: list[bytes] = []
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                if selector.select(remaining):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        return b"".join(chunks), True
                    chunks.append(chunk)
            return b"".join(chunks), False
        finally:
            os.close(fd)
