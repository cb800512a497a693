"""The driver's output, also appended to DRIVER_LOG under trainer.checkpointDir, where `kuberl logs` reads it.

On Kubernetes the checkpoint directory lies on the claim every Ray pod mounts: the file outlives the head pod, its
restarts and the Ray cluster, and each attempt appends after a header line. Everything the driver writes to
sys.stdout and sys.stderr (its step lines, logging, the worker output Ray forwards) goes to both, line by line.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from kuberl.api.contract import DRIVER_LOG, timestamp


class _Tee:
    """A text stream writing to `stream` and to the shared log file."""

    def __init__(self, stream: IO[str], log: IO[str], lock: threading.Lock) -> None:
        self.stream, self.log, self.lock = stream, log, lock

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        with self.lock, contextlib.suppress(OSError, ValueError):  # a full or gone claim never stops training
            self.log.write(text)
            if "\n" in text:
                self.log.flush()
        return written

    def flush(self) -> None:
        self.stream.flush()
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.log.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the terminal's
        return getattr(self.stream, name)


def log_path(checkpoint_dir: str | Path) -> Path:
    return Path(checkpoint_dir) / DRIVER_LOG


@contextlib.contextmanager
def teed(checkpoint_dir: str | Path, rljob: str) -> Iterator[Path | None]:
    """sys.stdout and sys.stderr also appended to the driver log, after a header naming this attempt; None (and a
    warning) when the file cannot be opened: the run goes on without it."""
    path = log_path(checkpoint_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        opened = path.open("a", buffering=1, encoding="utf-8")
    except OSError as exc:
        print(f"warning: no driver log at {path} ({exc.strerror}); `kuberl logs` will have nothing", file=sys.stderr)
        yield None
        return
    lock = threading.Lock()
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    saved = sys.stdout, sys.stderr
    try:
        with contextlib.suppress(OSError):
            opened.write(f"=== {timestamp()} RLJob {rljob}: the driver starts on {host}\n")
        sys.stdout, sys.stderr = _Tee(saved[0], opened, lock), _Tee(saved[1], opened, lock)
        print(f"driver log: {path} (`kuberl logs {rljob}` reads it)")
        yield path
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = saved
        with contextlib.suppress(OSError):  # a full claim loses the log's tail, never the run's exit status
            opened.close()
