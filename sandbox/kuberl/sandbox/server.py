"""The execution server of a sandbox pod: HTTP in front of an Executor.

    POST /execute   an Execution (JSON) → its ExecutionResult; 400 for a malformed one, 413 over MAX_REQUEST_BYTES,
                    503 (Retry-After) while `concurrency` executions run and as many again wait
    GET  /healthz   the isolation report, the limits, how many run and wait
    GET  /readyz    200 while it serves: isolation was verified at start (and, relying on a NetworkPolicy, again
                    every EGRESS_RECHECK_SECONDS)

A program can crash or hang only its own run: it runs in a jail the executor kills at its deadline. As pid 1 of a
pod the server ignores every signal sent from inside its pid namespace (the kernel drops SIGKILL and SIGSTOP from
there; SIGTERM is taken only from outside, i.e. from the kubelet), so a program sharing its uid cannot stop it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import socketserver
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kuberl.sandbox import isolation, linux
from kuberl.sandbox.executor import Executor
from kuberl.sandbox.jail import Mode
from kuberl.sandbox.protocol import Execution, ExecutionResult

MAX_REQUEST_BYTES = 4 << 20  # code and every run's stdin together
EGRESS_RECHECK_SECONDS = 60.0  # how often the server proves again that a NetworkPolicy blocks egress
STRAY_SWEEP_SECONDS = 0.5  # without namespaces: how often escaped descendants of killed jails are killed
OUTSIDE_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

log = logging.getLogger("kuberl.sandbox")


class Service:
    """What the handlers share: the executor, its isolation and the admission of requests."""

    def __init__(self, executor: Executor, isolation_: isolation.Isolation) -> None:
        self.executor = executor
        self.isolation = isolation_
        self._admitted = threading.BoundedSemaphore(2 * executor.concurrency)  # running + waiting
        self._lock = threading.Lock()
        self.running = 0
        self.verified = True  # by the start-up probe

    def execute(self, execution: Execution) -> ExecutionResult | None:
        """The result, or None when `concurrency` executions run and as many wait already."""
        if not self._admitted.acquire(blocking=False):
            return None
        try:
            with self._lock:
                self.running += 1
            return self.executor.execute(execution)
        finally:
            with self._lock:
                self.running -= 1
            self._admitted.release()

    def ready(self) -> bool:
        return self.verified

    def keep_verifying(self, stop: threading.Event) -> None:
        """Without namespaces the network is cut by the pod's NetworkPolicy: prove it again now and then (a policy
        can be deleted); the server is not ready while it does not hold."""
        while not stop.wait(EGRESS_RECHECK_SECONDS):
            try:
                self.isolation = isolation.decide("process")
                self.verified = True
            except isolation.SandboxUnavailable as exc:
                log.error("not ready: %s", exc)
                self.verified = False

    def health(self) -> dict[str, Any]:
        return {
            "isolation": self.isolation.mode,
            "enforced": list(self.isolation.enforced),
            "limits": self.executor.limits.to_wire(),
            "concurrency": self.executor.concurrency,
            "running": self.running,
        }


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        service = self.server.service
        if self.path == "/healthz":
            self._reply(HTTPStatus.OK, service.health())
        elif self.path == "/readyz":
            ready = service.ready()
            self._reply(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, {"ready": ready})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no {self.path}; GET /healthz, /readyz or POST /execute"})

    def do_POST(self) -> None:
        if self.path != "/execute":
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no {self.path}; POST /execute"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"{length} bytes; at most {MAX_REQUEST_BYTES}"})
            self.close_connection = True
            return
        try:
            execution = Execution.from_wire(json.loads(self.rfile.read(length)))
        except (ValueError, KeyError, TypeError) as exc:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"not an execution: {exc}"})
            return
        result = self.server.service.execute(execution)
        if result is None:
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "busy"}, {"Retry-After": "1"})
        else:
            self._reply(HTTPStatus.OK, result.to_wire())

    def _reply(self, status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    service: Service


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The same server on a Unix socket (a local pool, or one in a network namespace of its own)."""

    daemon_threads = True
    service: Service

    def get_request(self) -> tuple[socket.socket, Any]:
        request, _ = self.socket.accept()
        return request, ("unix", 0)  # BaseHTTPRequestHandler formats the client address as (host, port)


def listen(address: str, service: Service) -> Server | UnixServer:
    """`HOST:PORT` for TCP, `unix:PATH` for a Unix socket."""
    server: Server | UnixServer
    if address.startswith("unix:"):
        path = address.removeprefix("unix:")
        if os.path.exists(path):
            os.unlink(path)
        server = UnixServer(path, Handler)
    else:
        host, _, port = address.rpartition(":")
        server = Server((host or "0.0.0.0", int(port)), Handler)
    server.service = service
    return server


def serve(address: str, executor: Executor, isolation_: isolation.Isolation) -> None:
    """Serve until SIGTERM (from outside the pod when pid 1); the executor is closed afterwards."""
    if os.getpid() == 1:
        signal.pthread_sigmask(signal.SIG_BLOCK, OUTSIDE_SIGNALS)  # before any thread starts: all inherit it
    elif isolation_.mode is Mode.PROCESS:
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)  # escaped descendants come here, not to the host's init
    service = Service(executor, isolation_)
    server = listen(address, service)
    stop = threading.Event()
    if isolation_.mode is Mode.PROCESS:
        threading.Thread(target=_sweep_strays, args=(executor, stop), name="strays", daemon=True).start()
        threading.Thread(target=service.keep_verifying, args=(stop,), name="egress", daemon=True).start()
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    log.info("serving on %s, %d at once; %s", address, executor.concurrency, isolation_.report())
    try:
        _wait_for_stop()
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        executor.close()


def _wait_for_stop() -> None:
    if os.getpid() != 1:
        stopped = threading.Event()
        for sig in OUTSIDE_SIGNALS:
            signal.signal(sig, lambda *_: stopped.set())
        stopped.wait()
        return
    while True:
        info = signal.sigwaitinfo(OUTSIDE_SIGNALS)
        if info.si_pid == 0:  # sent from outside the pod's pid namespace: the kubelet, the container runtime
            log.info("stopping on %s", signal.Signals(info.si_signo).name)
            return
        log.warning("ignored %s from pid %d inside the pod", signal.Signals(info.si_signo).name, info.si_pid)


def _sweep_strays(executor: Executor, stop: threading.Event) -> None:
    while not stop.wait(STRAY_SWEEP_SECONDS):
        killed = executor.kill_strays()
        if killed:
            log.warning("killed %d processes left behind by killed jails", killed)
