"""What the start-up probe decides on this machine, and that it refuses rather than run programs with network."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kuberl.sandbox import isolation
from kuberl.sandbox.jail import Mode


def test_namespaces_are_found_and_verified_by_a_probe_program(namespace_mode: Mode) -> None:
    chosen = isolation.decide("auto")
    assert chosen.mode is namespace_mode
    assert any("network: a namespace of its own" in line for line in chosen.enforced)


def test_without_namespaces_on_a_networked_machine_the_sandbox_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(isolation.SandboxUnavailable, match="nothing keeps programs off the network"):
        isolation.decide("process")


def test_in_a_pod_whose_apiserver_answers_the_network_policy_is_not_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as apiserver:
        apiserver.bind(("127.0.0.1", 0))
        apiserver.listen()
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(apiserver.getsockname()[1]))
        with pytest.raises(isolation.SandboxUnavailable, match="does not enforce the pool's NetworkPolicy"):
            isolation.decide("process")


def test_in_a_pod_whose_apiserver_is_unreachable_process_isolation_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused, as a policy's reject does
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(closed.getsockname()[1]))
        chosen = isolation.decide("process")
    assert chosen.mode is Mode.PROCESS
    assert any("egress blocked by the pool's NetworkPolicy" in line for line in chosen.enforced)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take CAP_SYS_ADMIN away")
def test_the_server_refuses_to_start_where_neither_namespaces_nor_a_policy_hold() -> None:
    """No CAP_SYS_ADMIN (as in a container) and user namespaces refused: `serve` exits 1 with the reason."""
    command = [
        "setpriv",
        "--inh-caps=-sys_admin",
        "--bounding-set=-sys_admin",
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        'echo 0 > /proc/sys/user/max_user_namespaces; exec setpriv --bounding-set=-sys_admin --inh-caps=-all -- "$@"',
        "sh",
        sys.executable,
        "-m",
        "kuberl.sandbox",
        "probe",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result
    assert "the sandbox cannot isolate programs here" in result.stderr
