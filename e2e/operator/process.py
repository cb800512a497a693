"""Run the operator as a real process (`python -m kuberl.operator`) against the harness's apiserver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from e2e.harness import REPO_ROOT, free_port

PYTHONPATH = os.pathsep.join(str(REPO_ROOT / p) for p in ("api", "operator", "trainer", "."))


@dataclass
class OperatorProcess:
    """`python -m kuberl.operator` with KUBECONFIG set; start(), kill() (SIGKILL) or stop() (SIGTERM), restart()."""

    kubeconfig: Path
    log_dir: Path
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    extra_args: tuple[str, ...] = ()
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    popen: subprocess.Popen | None = field(init=False, default=None)
    starts: int = field(init=False, default=0)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def command(self) -> list[str]:
        scope = (
            ["--all-namespaces"] if self.all_namespaces else [a for ns in self.namespaces for a in ("--namespace", ns)]
        )
        return [
            sys.executable,
            "-m",
            "kuberl.operator",
            *scope,
            "--metrics-port",
            str(self.metrics_port),
            "--health-port",
            str(self.health_port),
            *self.extra_args,
        ]

    def start(self, wait_ready: bool = True, timeout: float = 30, bind_retries: int = 3) -> OperatorProcess:
        """Start the process; when it exits because a port picked earlier by ``free_port`` was taken meanwhile (an
        outgoing connection of another process may get that ephemeral port), pick fresh ports and start again."""
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONPATH": PYTHONPATH, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        if wait_ready:
            try:
                self.wait_ready(timeout)
            except RuntimeError:
                if bind_retries < 1 or "Address already in use" not in self.log_tail():
                    raise
                self.metrics_port, self.health_port = free_port(), free_port()
                return self.start(wait_ready, timeout, bind_retries - 1)
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"operator exited with {self.popen.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"operator not healthy after {timeout} s:\n{self.log_tail()}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def healthz(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=5) as resp:
            return resp.read().decode()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the OOM killer strikes."""
        if self.popen and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout: float = 15) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def logs(self) -> str:
        out = []
        for i in range(1, self.starts + 1):
            path = self.log_dir / f"operator-{i}.log"
            if path.exists():
                out.append(f"--- operator run {i} ---\n{path.read_text(errors='replace')}")
        return "\n".join(out)
