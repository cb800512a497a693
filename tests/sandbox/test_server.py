"""The execution server over real HTTP: results, admission (busy answers, retried by the client), bad requests."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator

import pytest

from kuberl.sandbox import isolation, server
from kuberl.sandbox.client import SandboxClient, execute_all
from kuberl.sandbox.jail import Mode
from kuberl.sandbox.protocol import Call, Execution, Outcome, Run
from tests.sandbox.conftest import SMALL, Jail


@pytest.fixture
def address(jail: Jail, namespace_mode: Mode) -> Iterator[str]:
    """A server of one execution at a time on 127.0.0.1."""
    executor = jail(concurrency=1)
    checked = isolation.Isolation(namespace_mode, ("checked by the namespace_mode fixture",))
    http_server = server.listen("127.0.0.1:0", server.Service(executor, checked))
    thread = threading.Thread(target=http_server.serve_forever, daemon=True)
    thread.start()
    host, port = http_server.server_address[:2]
    yield f"{host}:{port}"
    http_server.shutdown()
    http_server.server_close()


def post(address: str, body: bytes) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(address, timeout=30)
    connection.request("POST", "/execute", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_an_execution_comes_back_with_every_run(address: str) -> None:
    client = SandboxClient(f"http://{address}", 1, request_seconds=30)
    code = "import sys\ndef double(x):\n    return 2 * x\nprint(sys.stdin.read().upper())\n"
    result = client.execute(Execution(code, (Run(stdin="hi"), Run(call=Call("double", [21])))))
    assert [r.outcome for r in result.runs] == [Outcome.OK, Outcome.OK]
    assert result.runs[0].stdout == "HI\n"
    assert result.runs[1].returned == "42"


def test_beyond_running_and_waiting_executions_the_server_answers_busy_and_the_client_retries(address: str) -> None:
    slow = json.dumps(Execution("import time\ntime.sleep(1)\n").to_wire()).encode()
    answers: list[int] = []
    threads = [threading.Thread(target=lambda: answers.append(post(address, slow)[0])) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [200, 200, 503, 503]  # one runs, one waits, the rest are told to come back
    client = SandboxClient(f"http://{address}", 4, request_seconds=30)
    results = execute_all(client, [Execution(f"print({i})") for i in range(4)])
    assert [r.runs[0].stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]


def test_a_malformed_execution_is_refused_with_the_reason(address: str) -> None:
    status, body = post(address, json.dumps({"code": "print(1)", "runs": []}).encode())
    assert status == 400
    assert "runs (a non-empty list)" in body["error"]


def test_an_oversized_execution_is_refused_before_its_body_is_read(address: str) -> None:
    connection = http.client.HTTPConnection(address, timeout=10)
    connection.putrequest("POST", "/execute")
    connection.putheader("Content-Length", str(server.MAX_REQUEST_BYTES + 1))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    assert (
        json.loads(response.read())["error"]
        == f"{server.MAX_REQUEST_BYTES + 1} bytes; at most {server.MAX_REQUEST_BYTES}"
    )


def test_an_unsupported_language_fails_the_execution_with_the_languages_offered(address: str) -> None:
    client = SandboxClient(f"http://{address}", 1, request_seconds=30)
    result = client.execute(Execution("int main() {}", language="c"))
    assert result.runs[0].outcome is Outcome.SANDBOX_ERROR
    assert result.error == "language 'c' is not supported; use one of python"


def test_health_reports_what_is_enforced(address: str) -> None:
    connection = http.client.HTTPConnection(address, timeout=10)
    connection.request("GET", "/healthz")
    health = json.loads(connection.getresponse().read())
    assert health["limits"] == SMALL.to_wire()
    assert health["concurrency"] == 1
    connection.request("GET", "/readyz")
    assert connection.getresponse().status == 200


def test_a_pod_server_whose_network_policy_stops_holding_is_no_longer_ready(
    jail: Jail, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process isolation relies on the pod's NetworkPolicy: the server proves it again and again, and on this
    networked machine (no policy) the proof fails, so /readyz turns 503."""
    monkeypatch.setattr(server, "EGRESS_RECHECK_SECONDS", 0.05)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    service = server.Service(jail(), isolation.Isolation(Mode.PROCESS, ("verified at start",)))
    assert service.ready()
    stop = threading.Event()
    thread = threading.Thread(target=service.keep_verifying, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while service.ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not service.ready()
    finally:
        stop.set()
        thread.join()
