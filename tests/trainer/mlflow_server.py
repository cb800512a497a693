"""A real MLflow tracking server (PyPI `mlflow`, in a venv of its own under ~/.cache/kuberl, made once) for the
mlflow logger's tests; the trainer talks to it over its REST API and needs no MLflow package itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from e2e.harness import free_port

MLFLOW_VERSION = "3.17.2"  # 3.18.0 needs an mlflow-tracing 3.18.0 that PyPI does not have
VENV = Path(os.environ.get("KUBERL_CACHE_DIR", Path.home() / ".cache" / "kuberl")) / f"mlflow-{MLFLOW_VERSION}"


class Unavailable(LookupError):
    """mlflow could not be installed (offline): the one-line reason."""


def mlflow_command() -> Path:
    """The venv's `mlflow`, installed on first use (a stamp marks a finished install)."""
    command, done = VENV / "bin" / "mlflow", VENV / ".installed"
    if done.is_file():
        return command
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    install = [str(VENV / "bin" / "pip"), "install", "-q", f"mlflow=={MLFLOW_VERSION}"]
    result = subprocess.run(install, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise Unavailable(f"pip install mlflow=={MLFLOW_VERSION}: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    done.touch()
    return command


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """`mlflow server` on a free local port with a SQLite store in `folder`; its URL while it runs."""
    port = free_port()
    command = [str(mlflow_command()), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--default-artifact-root", str(folder)]
    log = (folder / "server.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # its first start migrates the SQLite store: minutes on a busy machine
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start:\n{(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
