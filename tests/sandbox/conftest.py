"""Fixtures of the sandbox tests: jails with small limits on this machine, and things a program must not reach."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.fixtures import in_ci
from kuberl.sandbox import isolation
from kuberl.sandbox.executor import Executor
from kuberl.sandbox.jail import Mode
from kuberl.sandbox.protocol import Execution, Limits, Run, RunResult

# Small limits keep every hostile program to seconds on a 2-core CI machine.
SMALL = Limits(wall_seconds=3, cpu_seconds=1, memory_mb=128, processes=8, disk_mb=4, open_files=32, output_bytes=4096)


@pytest.fixture(scope="session")
def namespace_mode() -> Mode:
    """The namespace isolation this machine allows (root, or an unprivileged user namespace)."""
    try:
        return isolation.decide("namespaces", SMALL).mode
    except isolation.SandboxUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI must allow namespaces: {exc}", pytrace=False)
        pytest.skip(str(exc))


Jail = Callable[..., Executor]

FORK_BOMB = (
    "import os, time\n"
    "refused = 0\n"
    "while refused < 1000:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError:\n"
    "        refused += 1\n"
    "print('fork refused', flush=True)\n"
    "time.sleep(30)\n"
)
"""Forks until the process limit refuses it a thousand times, then holds on to every process it got."""


def attempt_each(action: str) -> str:
    """A program that tries `action` (Python on `target`) for each word of its stdin and prints each refusal."""
    return (
        "import socket, sys\n"
        "for target in sys.stdin.read().split():\n"
        "    try:\n"
        f"        {action}\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__, target)\n"
    )


@pytest.fixture
def jail(namespace_mode: Mode) -> Iterator[Jail]:
    """`jail(**limits)`: an Executor with SMALL's limits, some replaced; closed after the test."""
    made: list[Executor] = []

    def make(concurrency: int = 1, **changes: float) -> Executor:
        made.append(Executor(Limits(**{**SMALL.to_wire(), **changes}), concurrency, namespace_mode))
        return made[-1]

    yield make
    for executor in made:
        executor.close()


def run(executor: Executor, code: str, stdin: str = "") -> RunResult:
    """The one run of `code`."""
    result = executor.execute(Execution(code, (Run(stdin=stdin),)))
    assert result.error is None, result.error
    return result.runs[0]


def assert_still_serves(executor: Executor) -> None:
    """A well-behaved program still runs, and correctly, after whatever ran before it."""
    after = run(executor, "print(6 * 7)")
    assert (after.outcome, after.stdout) == ("ok", "42\n"), after


@dataclass(frozen=True)
class Planted:
    """What a trainer pod holds that a program must not read or change: a service-account token and checkpoints."""

    token: Path
    checkpoint: Path
    writable: Path  # a world-writable folder of the host
    secret: str = "TOKEN-7c1e4d"


@pytest.fixture
def planted(tmp_path: Path) -> Planted:
    token = tmp_path / "var/run/secrets/kubernetes.io/serviceaccount/token"
    checkpoint = tmp_path / "checkpoints/global_step_3/model.safetensors"
    writable = tmp_path / "shared"
    for path in (token, checkpoint):
        path.parent.mkdir(parents=True)
        path.write_text(Planted.secret)
        path.chmod(0o644)
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)
    for folder in [tmp_path, *tmp_path.parents]:
        if folder == Path("/"):
            break
        folder.chmod(folder.stat().st_mode | 0o005)  # readable by anyone: only the jail may hide them
    return Planted(token, checkpoint, writable)


@pytest.fixture
def listeners() -> Iterator[dict[str, tuple[str, int, socket.socket]]]:
    """Real listening ports standing in for the apiserver and the Ray head's GCS, on every address of this host."""
    host = socket.gethostbyname(socket.gethostname())
    made = {}
    for name in ("apiserver", "ray-head"):
        listener = socket.socket()
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        listener.setblocking(False)
        made[name] = (host, listener.getsockname()[1], listener)
    yield made
    for _, _, listener in made.values():
        listener.close()


def connections_received(listener: socket.socket) -> int:
    count = 0
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


def processes_of(uids: range) -> list[int]:
    """Processes whose real uid is in `uids` (the executor's slot uids)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    found.append(int(entry))
            except FileNotFoundError:
                continue
    return found
