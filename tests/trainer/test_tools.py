"""Builtin tools and the tool worker pool: real processes, real timeouts, a real address-space limit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberl.trainer.rollout.tools import Request, ToolPool, ToolStartError, calculator, python_expr


def test_calculator_evaluates_arithmetic_only() -> None:
    assert calculator("123 * 456") == "56088"
    assert calculator("(7 - 10) / 2") == "-1.5"
    assert calculator("2 ** 10") == "1024"
    with pytest.raises(ValueError, match="numbers and"):
        calculator("__import__('os')")
    with pytest.raises(ValueError, match="exponent 100000 is above 1000"):
        calculator("2 ** 100000")


def test_python_expr_refuses_dunders_and_imports() -> None:
    assert python_expr("sum(x * x for x in range(4))") == "14"
    assert python_expr("math.floor(2.5)") == "2"
    with pytest.raises(ValueError, match=r"attribute '__\w+__' is not allowed"):
        python_expr("().__class__.__bases__")
    with pytest.raises(NameError):
        python_expr("open('/etc/passwd')")
    with pytest.raises(SyntaxError):
        python_expr("import os")


def call(tool: str, timeout: float = 5.0, **arguments: object) -> Request:
    return Request("call", {"tool": tool, "arguments": arguments}, timeout)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolPool]:
    folder = tmp_path_factory.mktemp("tools")
    (folder / "user.py").write_text(
        "import os, time\n"
        "def chatty(text):\n    print('noise on stdout')\n    return text.upper()\n"
        "def sleepy(seconds):\n    time.sleep(seconds)\n    return 'woke'\n"
        "def pid():\n    return os.getpid()\n"
        "def hog(mb):\n    return len(bytearray(mb * 1024 * 1024))\n"
    )
    tools = {"calculator": "calculator", **{n: f"{folder}/user.py:{n}" for n in ("chatty", "sleepy", "pid", "hog")}}
    pool = ToolPool(tools, environment=None, workers=2, memory_limit_mb=256)
    yield pool
    pool.close()


def test_tools_run_in_other_processes_and_print_does_not_break_replies(pool: ToolPool) -> None:
    import os

    chatty, pid = pool.run([call("chatty", text="abc"), call("pid")])
    assert (chatty.ok, chatty.output) == (True, "ABC")
    assert pid.ok and int(pid.output or 0) != os.getpid()


def test_calls_run_concurrently_and_a_timeout_kills_only_its_worker(pool: ToolPool) -> None:
    start = time.monotonic()
    slow, fast, late = pool.run([call("sleepy", timeout=0.5, seconds=60), call("sleepy", seconds=0.2), call("pid")])
    assert slow.timed_out and not slow.ok and slow.error == "timed out"
    assert (fast.ok, fast.output, late.ok) == (True, "woke", True)
    assert time.monotonic() - start < 5
    assert pool.run([call("calculator", expression="6*7")])[0].output == "42"  # the replaced worker serves


def test_the_memory_limit_turns_a_hog_into_an_error(pool: ToolPool) -> None:
    hog, small = pool.run([call("hog", mb=1024), call("hog", mb=8)])
    assert not hog.ok and hog.error.startswith("MemoryError")
    assert (small.ok, small.output) == (True, str(8 * 1024 * 1024))


def test_a_tool_that_cannot_load_fails_at_start_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ToolStartError, match="no_such_module"):
        ToolPool({"x": "no_such_module:f"}, environment=None, workers=1, memory_limit_mb=256)
