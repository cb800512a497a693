"""The python tool: the policy's program run in the job's tools pool (a real local server, as `kuberl run` starts
it), called from real tool worker processes, its output and how it ended written for the policy to read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kuberl.api.contract import SANDBOX_TOOLS
from kuberl.api.spec import AGENT_BUILTIN_TOOLS, SANDBOXED_TOOLS
from kuberl.sandbox.client import pool_variable
from kuberl.trainer.rollout import sandbox_tools
from kuberl.trainer.rollout.tools import BUILTIN_TOOLS, Request, ToolPool
from tests.trainer.sandbox_pools import served, spec_with_pools


def test_the_tools_pool_is_the_one_the_api_names() -> None:
    assert sandbox_tools.POOL == SANDBOX_TOOLS
    assert set(BUILTIN_TOOLS) == set(AGENT_BUILTIN_TOOLS)
    assert all(BUILTIN_TOOLS[name].__module__ == sandbox_tools.__name__ for name in SANDBOXED_TOOLS)


@pytest.fixture(scope="module")
def tool_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolPool]:
    """Two tool workers started while the tools pool is announced, as the driver starts them."""
    with served(spec_with_pools(tools={"executionsPerPod": 2}), tmp_path_factory.mktemp("pool")):
        workers = ToolPool({"python": "python"}, environment=None, workers=2, memory_limit_mb=512)
        yield workers
        workers.close()


def python_call(code: str) -> Request:
    return Request("call", {"tool": "python", "arguments": {"code": code}}, timeout=30)


def test_a_program_runs_in_the_sandbox_and_its_output_comes_back(tool_workers: ToolPool) -> None:
    (result,) = tool_workers.run(
        [python_call("import socket\nprint(sum(range(10)))\nsocket.create_connection(('1.1.1.1', 53), 1)")]
    )
    assert result.ok
    output = result.output or ""
    assert output.startswith("45\nTraceback") and "OSError: [Errno 101] Network is unreachable" in output


def test_a_failing_program_shows_its_traceback_and_exit_status(tool_workers: ToolPool) -> None:
    (result,) = tool_workers.run([python_call("print('before')\n1 / 0\n")])
    assert result.ok
    output = result.output or ""
    assert output.startswith("before\nTraceback")
    assert "ZeroDivisionError: division by zero" in output
    assert output.endswith("[exit status 1]")


def test_a_program_past_the_wall_clock_is_killed_and_says_so(tool_workers: ToolPool) -> None:
    (result,) = tool_workers.run([python_call("import time\nprint('waiting', flush=True)\ntime.sleep(60)\n")])
    assert (result.ok, result.output) == (True, "waiting\n[killed: past the wall-clock limit]")


def test_without_a_tools_pool_the_call_fails_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pool_variable(SANDBOX_TOOLS), raising=False)
    workers = ToolPool({"python": "python"}, environment=None, workers=1, memory_limit_mb=512)
    try:
        (result,) = workers.run([python_call("print(1)")])
    finally:
        workers.close()
    assert not result.ok
    assert "LookupError" in result.error and "rollout.agent.sandbox for tools" in result.error
