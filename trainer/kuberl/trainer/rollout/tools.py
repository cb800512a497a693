"""Tools and environments of agent rollouts, run in worker processes that the trainer can kill.

Why processes: a tool is user code (or evaluates policy-written expressions); a hang, a crash or a memory blow-up
must cost one call, not the job. Each worker is ``python -m kuberl.trainer.rollout.tools`` with an address-space limit
(``RLIMIT_AS``); the driver sends one JSON request per line on its stdin and reads one JSON reply per line from a
private pipe (the worker's stdout is redirected to stderr so that a tool's ``print`` cannot corrupt the protocol).
A call past its timeout kills the worker (SIGKILL) and starts a fresh one; the caller gets a timeout result. Only
the standard library and the sandbox's client are imported here: the workers must start fast and stay small.

Builtin tools: ``calculator`` (arithmetic on numbers), ``python_expr`` (one Python expression over a small set
of pure builtins; no names, attributes or imports beyond them) and ``python`` (a whole program, run in the job's
sandbox pool: :mod:`kuberl.trainer.rollout.sandbox_tools`).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import json
import math
import operator
import os
import resource
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.trainer.rollout.sandbox_tools import python

# --- builtin tools -------------------------------------------------------------------------------------------------

ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_EXPONENT = 1000


def format_number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def calculator(expression: str) -> str:
    """Evaluate arithmetic: numbers, + - * / // % **, parentheses, unary minus. Exponents above 1000 are refused."""

    def evaluate(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return evaluate(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = evaluate(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            left, right = evaluate(node.left), evaluate(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
            return ARITHMETIC[type(node.op)](left, right)
        raise ValueError(f"calculator accepts numbers and + - * / // % ** only, not {ast.unparse(node)!r}")

    return format_number(evaluate(ast.parse(str(expression).strip(), mode="eval")))


PURE_BUILTINS: dict[str, Any] = {
    name: getattr(builtins, name)
    for name in [
        "abs",
        "all",
        "any",
        "bool",
        "dict",
        "divmod",
        "enumerate",
        "filter",
        "float",
        "int",
        "len",
        "list",
        "map",
        "max",
        "min",
        "pow",
        "range",
        "reversed",
        "round",
        "set",
        "sorted",
        "str",
        "sum",
        "tuple",
        "zip",
        "True",
        "False",
        "None",
    ]
}
PURE_BUILTINS.update({"math": math})


def python_expr(expression: str) -> str:
    """Evaluate one Python expression over pure builtins and ``math``: no imports, no dunder attributes, no
    assignments or statements. Runs in a tool worker, so time and memory are bounded by the worker's limits."""
    tree = ast.parse(str(expression).strip(), mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            raise ValueError(f"attribute {node.attr!r} is not allowed")
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            raise ValueError(f"name {node.id!r} is not allowed")
    result = eval(compile(tree, "<python_expr>", "eval"), {"__builtins__": PURE_BUILTINS}, {})
    return format_number(result)


BUILTIN_TOOLS: dict[str, Callable[..., Any]] = {"calculator": calculator, "python_expr": python_expr, "python": python}


def load_object(path: str) -> Any:
    """A builtin tool by name, ``package.module:name`` from ``sys.path`` or ``path/to/file.py:name``."""
    if path in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[path]
    target, _, attribute = path.rpartition(":")
    if not target or not attribute:
        raise ValueError(f"{path!r} is neither a builtin ({sorted(BUILTIN_TOOLS)}) nor 'module:name'")
    if target.endswith(".py") or "/" in target:
        file = Path(target).expanduser()
        spec = importlib.util.spec_from_file_location(f"kuberl_tool_{file.stem}", file)
        if not file.is_file() or spec is None or spec.loader is None:
            raise ValueError(f"{path!r}: {target} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    if not hasattr(module, attribute):
        raise ValueError(f"{path!r}: {target} has no attribute {attribute!r}")
    return getattr(module, attribute)


# --- the worker side -----------------------------------------------------------------------------------------------


def serve(tools: dict[str, str], environment: str | None, memory_limit_mb: int, reply_fd: int) -> None:
    """Answer requests from stdin until it closes: ``{"op": "call", "tool", "arguments"}``,
    ``{"op": "reset", "key", "prompt", "extra_info"}``, ``{"op": "step", "key", "action"}``."""
    limit = memory_limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    replies = os.fdopen(reply_fd, "w", buffering=1)
    try:
        functions = {name: load_object(path) for name, path in tools.items()}
        env_class = load_object(environment) if environment else None
    except Exception as e:
        replies.write(json.dumps({"ok": False, "error": f"loading failed: {type(e).__name__}: {e}"}) + "\n")
        return
    replies.write(json.dumps({"ok": True}) + "\n")
    envs: dict[str, Any] = {}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "call":
                reply: dict[str, Any] = {"output": str(functions[request["tool"]](**request["arguments"]))}
            elif request["op"] == "reset":
                assert env_class is not None, "reset without an environment"
                envs[request["key"]] = env = env_class()
                first = env.reset(request["prompt"], request["extra_info"])
                reply = {"output": None if first is None else str(first)}
            else:
                observation, reward, done = envs[request["key"]].step(request["action"])
                if done:
                    envs.pop(request["key"])
                reply = {"output": str(observation), "reward": float(reward), "done": bool(done)}
            reply["ok"] = True
        except BaseException as e:  # the worker survives anything the tool raises, MemoryError included
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")


def main() -> None:
    config = json.loads(sys.argv[1])
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # a tool's print goes to stderr, never into the replies
    sys.stdout = sys.stderr
    serve(config["tools"], config["environment"], config["memory_limit_mb"], reply_fd)


# --- the driver side -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    op: str
    """call | reset | step."""
    payload: dict[str, Any]
    timeout: float
    worker: int | None = None
    """Pin to one worker (an environment's state lives in the worker that reset it); None: any idle worker."""


@dataclass
class Result:
    ok: bool
    output: str | None = None
    """The tool's output; None only when an environment's reset gives no first observation."""
    error: str = ""
    timed_out: bool = False
    seconds: float = 0.0
    reward: float = 0.0
    done: bool = False


class ToolStartError(RuntimeError):
    """A tool worker could not load the tools (bad module path, import error): the job cannot run."""


class Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        read_fd, write_fd = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kuberl.trainer.rollout.tools", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=write_fd,
            text=True,
            start_new_session=True,  # a terminal's ^C reaches the trainer, which stops the workers itself
        )
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r")
        self.generation = 0
        """Bumped on every restart: environments of an older generation are gone."""

    def send(self, request: Request) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": request.op, **request.payload}) + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.replies.close()
        if self.process.stdin is not None:
            self.process.stdin.close()


class ToolPool:
    """``workers`` tool processes; :meth:`run` executes a batch of requests concurrently and returns their results
    in order. Nothing a tool does raises here: errors and timeouts come back as results."""

    def __init__(self, tools: dict[str, str], *, environment: str | None, workers: int, memory_limit_mb: int) -> None:
        self.config = {"tools": tools, "environment": environment, "memory_limit_mb": memory_limit_mb}
        self.workers: list[Worker] = []
        for _ in range(workers):
            self.workers.append(self.start())

    def start(self) -> Worker:
        worker = Worker(self.config)
        greeting = worker.replies.readline()
        if not greeting or not json.loads(greeting)["ok"]:
            worker.kill()
            problem = json.loads(greeting)["error"] if greeting else "the worker exited at start"
            self.close()
            raise ToolStartError(f"rollout.agent: tool worker cannot start ({self.config}): {problem}")
        return worker

    def run(self, requests: list[Request]) -> list[Result]:
        results: list[Result | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        busy: dict[int, tuple[int, float]] = {}  # worker → (request index, start time)
        with selectors.DefaultSelector() as selector:
            while pending or busy:
                for w in range(len(self.workers)):
                    if w in busy:
                        continue
                    index = next((i for i in pending if requests[i].worker in (None, w)), None)
                    if index is None:
                        continue
                    pending.remove(index)
                    self.workers[w].send(requests[index])
                    busy[w] = (index, time.monotonic())
                    selector.register(self.workers[w].replies, selectors.EVENT_READ, w)
                now = time.monotonic()
                wait = min(requests[i].timeout - (now - t0) for i, t0 in busy.values())
                for key, _ in selector.select(max(wait, 0.0)):
                    w = key.data
                    index, t0 = busy.pop(w)
                    selector.unregister(key.fileobj)
                    line = self.workers[w].replies.readline()
                    seconds = time.monotonic() - t0
                    if not line:  # the worker died (e.g. killed by the kernel); restart it
                        results[index] = Result(False, error="the tool worker died", seconds=seconds)
                        self.restart(w)
                        continue
                    reply = json.loads(line)
                    results[index] = Result(
                        reply["ok"],
                        output=reply.get("output"),
                        error=reply.get("error", ""),
                        seconds=seconds,
                        reward=reply.get("reward", 0.0),
                        done=reply.get("done", False),
                    )
                now = time.monotonic()
                for w, (index, t0) in list(busy.items()):
                    if now - t0 >= requests[index].timeout:
                        busy.pop(w)
                        selector.unregister(self.workers[w].replies)
                        self.restart(w)
                        results[index] = Result(False, error="timed out", timed_out=True, seconds=now - t0)
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def restart(self, w: int) -> None:
        generation = self.workers[w].generation + 1
        self.workers[w].kill()
        self.workers[w] = self.start()
        self.workers[w].generation = generation

    def generation(self, w: int) -> int:
        return self.workers[w].generation

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.workers = []


if __name__ == "__main__":
    main()
