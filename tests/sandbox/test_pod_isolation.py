"""Without namespaces (a sandbox pod): hostile programs that share the server's uid are contained, the server (pid
1) outlives every one of them, and nothing they start outlives their run. The server runs in `tests.sandbox.pod`'s
stand-in for a pod and is driven over HTTP on a Unix socket, as the trainer drives a pool over its Service."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberl.sandbox.client import SandboxClient
from kuberl.sandbox.protocol import TIME_LIMITS, Execution, ExecutionResult, Outcome, Run, RunResult
from tests.sandbox.conftest import FORK_BOMB, SMALL, processes_of
from tests.sandbox.pod import POD_UID, Pod, start_pod


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    if os.geteuid() != 0:
        pytest.skip("standing in for a pod needs root (namespaces, another uid)")
    workdir = Path(tempfile.mkdtemp(prefix="kuberl-pod-"))  # in /tmp: pytest's folders are closed to other uids
    try:
        started = start_pod(SMALL, executions=2, workdir=workdir)
        yield started
        started.stop()
        assert processes_of(range(POD_UID, POD_UID + 1)) == [], "the pod's processes outlived it"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def execute(client: SandboxClient, code: str, stdin: str = "") -> ExecutionResult:
    return client.execute(Execution(code, (Run(stdin=stdin),)))


def only(result: ExecutionResult) -> RunResult:
    assert result.error is None, result.error
    return result.runs[0]


RESIDENT = 2  # the server (pid 1) and its fork server


def settle(pod: Pod) -> list[int]:
    """The pod's processes once the server's sweep had its turn: only the resident ones, when nothing escaped."""
    deadline = time.monotonic() + 5
    while True:
        left = processes_of(range(POD_UID, POD_UID + 1))
        if len(left) <= RESIDENT or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def assert_serves(pod: Pod) -> None:
    result = only(execute(pod.client, "print(sum(range(10)))"))
    assert (result.outcome, result.stdout) == (Outcome.OK, "45\n"), result
    assert len(settle(pod)) == RESIDENT, "a process outlived its run"


def test_the_server_is_pid_1_and_ignores_signals_from_programs(pod: Pod) -> None:
    killer = (
        "import os, signal\n"
        "for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
        "    os.kill(1, sig)\n"
        "print('sent')\n"
    )
    result = only(execute(pod.client, killer))
    assert (result.outcome, result.stdout) == (Outcome.OK, "sent\n")
    assert "ignored SIGTERM from pid" in pod.log.read_text()
    assert_serves(pod)


def test_a_program_that_kills_its_jail_fails_that_execution_only(pod: Pod) -> None:
    result = execute(
        pod.client, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(30)"
    )
    assert result.error is not None and "without a result" in result.error
    assert result.runs[0].outcome is Outcome.SANDBOX_ERROR
    assert_serves(pod)


def test_killing_every_process_it_may_signal_spares_the_server(pod: Pod) -> None:
    neighbour: list[ExecutionResult] = []
    thread = threading.Thread(target=lambda: neighbour.append(execute(pod.client, "import time\ntime.sleep(2)")))
    thread.start()
    time.sleep(0.5)
    killer = execute(pod.client, "import os, signal\nos.kill(-1, signal.SIGKILL)\n")
    thread.join()
    assert killer.runs[0].outcome is Outcome.SANDBOX_ERROR  # it killed its own jail too
    assert neighbour[0].runs[0].outcome is not Outcome.OK  # a concurrent execution shares the uid (docs/security.md)
    assert_serves(pod)  # the fork server was killed too: the executor started a new one


def test_a_fork_bomb_stops_at_the_process_limit(pod: Pod) -> None:
    result = only(execute(pod.client, FORK_BOMB))
    assert result.outcome is Outcome.WALL_TIMEOUT
    assert "fork refused" in result.stdout
    assert_serves(pod)


def test_a_daemon_that_leaves_its_session_is_killed_with_its_run(pod: Pod) -> None:
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('left a daemon')\n"
    )
    assert only(execute(pod.client, daemon)).outcome is Outcome.OK
    assert_serves(pod)


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        ("while True:\n    pass\n", Outcome.CPU_TIMEOUT),
        ("import time\ntime.sleep(60)\n", Outcome.WALL_TIMEOUT),
        ("x = bytearray(1 << 30)\n", Outcome.MEMORY),
        ("while True:\n    print('y' * 1000)\n", Outcome.OUTPUT_LIMIT),
        (
            "import socket\nsocket.create_connection(('10.96.0.1', 443), timeout=1)\n",  # a cluster's apiserver
            Outcome.ERROR,
        ),
    ],
    ids=["infinite-loop", "sleep", "memory-bomb", "huge-output", "socket"],
)
def test_limits_hold_without_namespaces(pod: Pod, code: str, outcome: Outcome) -> None:
    result = only(execute(pod.client, code))
    if outcome is Outcome.CPU_TIMEOUT:  # a busy 2-core machine may give it less than its CPU second in 3 s
        assert result.outcome in TIME_LIMITS, result
    else:
        assert result.outcome is outcome, result
    assert_serves(pod)


def test_programs_run_as_the_pods_uid_in_their_own_directory(pod: Pod) -> None:
    result = only(execute(pod.client, "import os\nprint(os.getuid(), os.listdir('.'))"))
    assert result.stdout == f"{POD_UID} ['solution.py']\n"
