"""Hostile programs, really run in the jail on this machine: each is contained, reported as a failed run with its
reason, and the executor goes on serving. Namespaces as this machine allows them (root here and in CI)."""

from __future__ import annotations

import os
import time

from kuberl.sandbox.executor import UID_BASE
from kuberl.sandbox.jail import Mode
from kuberl.sandbox.protocol import Execution, Outcome, Run
from tests.sandbox.conftest import (
    FORK_BOMB,
    SMALL,
    Jail,
    Planted,
    assert_still_serves,
    attempt_each,
    connections_received,
    processes_of,
    run,
)

SLOT_UIDS = range(UID_BASE, UID_BASE + 64)


def test_an_infinite_loop_is_stopped_at_its_cpu_limit(jail: Jail) -> None:
    executor = jail(wall_seconds=20, cpu_seconds=1)
    result = run(executor, "while True:\n    pass\n")
    assert result.outcome is Outcome.CPU_TIMEOUT
    assert 0.5 < result.cpu_seconds < 3  # the kernel samples CPU time per tick; rusage accounts it finer
    assert_still_serves(executor)


def test_sleeping_past_the_wall_clock_is_killed_at_the_limit(jail: Jail) -> None:
    executor = jail(wall_seconds=1.5)
    result = run(executor, "import time\ntime.sleep(60)\n")
    assert result.outcome is Outcome.WALL_TIMEOUT
    assert 1.5 <= result.wall_seconds < 3
    assert result.signal == 9
    assert_still_serves(executor)


def test_after_a_run_past_its_time_the_execution_skips_every_later_run(jail: Jail) -> None:
    executor = jail(wall_seconds=1)
    result = executor.execute(
        Execution("import time\ntime.sleep(int(input()))\n", tuple(Run(f"{s}\n") for s in (0, 9, 0, 0)))
    )
    assert [r.outcome for r in result.runs] == [Outcome.OK, Outcome.WALL_TIMEOUT, Outcome.SKIPPED, Outcome.SKIPPED]
    assert_still_serves(executor)


def test_a_fork_bomb_is_held_to_the_process_limit_and_leaves_nothing_behind(jail: Jail, namespace_mode: Mode) -> None:
    executor = jail(wall_seconds=2, processes=8)
    result = run(executor, FORK_BOMB)
    assert result.outcome is Outcome.WALL_TIMEOUT
    assert "fork refused" in result.stdout
    if namespace_mode is Mode.ROOT:
        assert processes_of(SLOT_UIDS) == []
    assert_still_serves(executor)


def test_a_memory_bomb_fails_with_memory(jail: Jail) -> None:
    executor = jail(memory_mb=128)
    result = run(executor, "hoard = []\nwhile True:\n    hoard.append(bytearray(10**6))\n")
    assert result.outcome is Outcome.MEMORY
    assert "MemoryError" in result.stderr
    assert_still_serves(executor)


def test_huge_output_is_cut_at_the_cap_and_the_program_killed(jail: Jail) -> None:
    executor = jail(output_bytes=4096, wall_seconds=10)
    result = run(executor, "while True:\n    print('x' * 1000)\n")
    assert result.outcome is Outcome.OUTPUT_LIMIT
    assert result.truncated
    assert len(result.stdout) == 4096
    assert result.wall_seconds < 5
    assert_still_serves(executor)


def test_the_token_and_the_checkpoints_cannot_be_read(jail: Jail, planted: Planted) -> None:
    executor = jail()
    reader = attempt_each("print(open(target).read())")
    paths = [planted.token, planted.checkpoint, "/var/run/secrets/kubernetes.io/serviceaccount/token"]
    result = run(executor, reader, stdin=" ".join(map(str, paths)))
    assert result.outcome is Outcome.OK
    assert planted.secret not in result.stdout + result.stderr
    assert result.stdout.count("FileNotFoundError") == 3, result.stdout
    assert_still_serves(executor)


def test_writing_outside_the_working_directory_changes_nothing_on_the_host(jail: Jail, planted: Planted) -> None:
    executor = jail()
    marker = f"/tmp/kuberl-sandbox-escape-{os.getpid()}"
    writer = attempt_each("open(target, 'w').write('escaped'); print('wrote', target)")
    targets = [planted.writable / "x", planted.checkpoint, marker, "../escaped", "/usr/escaped", "/escaped"]
    result = run(executor, writer, stdin=" ".join(map(str, targets)))
    assert result.outcome is Outcome.OK
    assert list(planted.writable.iterdir()) == []
    assert planted.checkpoint.read_text() == planted.secret
    assert not os.path.exists(marker)
    assert not os.path.exists("/usr/escaped") and not os.path.exists("/escaped")
    assert f"wrote {marker}" in result.stdout  # /tmp is the jail's own, and vanished with it
    assert_still_serves(executor)


def test_sockets_to_the_apiserver_and_the_ray_head_get_nowhere(jail: Jail, listeners: dict) -> None:
    executor = jail()
    dialer = attempt_each(
        "socket.create_connection((target.rsplit(':', 1)[0], int(target.rsplit(':', 1)[1])), timeout=1).close(); "
        "print('connected', target)"
    )
    targets = [f"{where}:{port}" for host, port, _ in listeners.values() for where in (host, "127.0.0.1")]
    result = run(executor, dialer, stdin=" ".join(targets))
    assert result.outcome is Outcome.OK
    assert "connected" not in result.stdout, result.stdout
    assert result.stdout.count("OSError") == len(targets), result.stdout  # ENETUNREACH: no network at all
    assert all(connections_received(listener) == 0 for _, _, listener in listeners.values())
    assert_still_serves(executor)


def test_killing_the_parent_the_server_or_everything_harms_only_the_program(jail: Jail) -> None:
    executor = jail()
    killer = (
        "import os, signal, sys\n"
        "server = int(sys.stdin.read())\n"
        "for target in (os.getppid(), 1, server):\n"
        "    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):\n"
        "        try:\n"
        "            os.kill(target, sig)\n"
        "        except OSError as exc:\n"
        "            print(type(exc).__name__, target, sig.name)\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)  # every process it may signal\n"
        "except OSError as exc:\n"
        "    print(type(exc).__name__, -1)  # none: the supervisor is pid 1 and root\n"
        "print('still here')\n"
    )
    result = run(executor, killer, stdin=str(os.getpid()))
    assert result.outcome is Outcome.OK, result
    assert "still here" in result.stdout
    assert_still_serves(executor)


def test_a_daemon_that_escapes_its_session_is_killed_with_the_run(jail: Jail, namespace_mode: Mode) -> None:
    executor = jail()
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n"
        "print('left a daemon')\n"
    )
    started = time.monotonic()
    result = run(executor, daemon)
    assert result.outcome is Outcome.OK
    assert time.monotonic() - started < SMALL.wall_seconds
    if namespace_mode is Mode.ROOT:
        assert processes_of(SLOT_UIDS) == []
    assert_still_serves(executor)


def test_a_run_cannot_leave_files_for_the_next_run(jail: Jail) -> None:
    executor = jail()
    code = "import os\nprint(sorted(os.listdir('.')))\nopen('left-over', 'w').write('x')\n"
    result = executor.execute(Execution(code, (Run(), Run())))
    assert [r.stdout for r in result.runs] == ["['solution.py']\n"] * 2
