"""What the trainer asks the sandbox to run and what it gets back, and the limits every run is held to.

One wire format for the three hops (client → server over HTTP, server → jail over a pipe, jail → server): plain
JSON objects with the field names below. Standard library only: the jail imports this module in an interpreter
started without site-packages.

An execution is one program and a list of runs; each run starts the program afresh in a fresh working directory,
with its own stdin or a call of one function of the program. Expected outputs never enter the sandbox: a program
cannot read its tests' answers, and whether a run passed is decided outside (`kuberl.sandbox.grading`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

LANGUAGES = ("python",)
"""Languages the jail runs (`Execution.language`)."""


@dataclass(frozen=True)
class Limits:
    """What one run of a program may use; the server's, never the request's (a request cannot raise them)."""

    wall_seconds: float = 10.0  # wall-clock time of one run; past it every process of the run is killed
    cpu_seconds: int = 5  # CPU time of each process of a run (RLIMIT_CPU: SIGXCPU, then SIGKILL a second later)
    memory_mb: int = 512  # address space of each process (RLIMIT_AS)
    processes: int = 16  # processes and threads the run may have at once (RLIMIT_NPROC)
    disk_mb: int = 16  # largest file (RLIMIT_FSIZE), and with namespaces the size of the working directory (tmpfs)
    open_files: int = 64  # file descriptors of each process (RLIMIT_NOFILE)
    output_bytes: int = 65536  # stdout and stderr each; a run that writes more is killed and its output cut here

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Limits:
        return cls(**data)


@dataclass(frozen=True)
class Call:
    """Call `function` of the program with `args` (JSON values) after its module code has run."""

    function: str
    args: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """One start of the program: `stdin` on its standard input, and optionally a call whose return value comes back."""

    stdin: str = ""
    call: Call | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"stdin": self.stdin}
        if self.call is not None:
            wire["call"] = {"function": self.call.function, "args": self.call.args}
        return wire

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Run:
        call = data.get("call")
        return cls(
            stdin=str(data.get("stdin", "")),
            call=None if call is None else Call(str(call["function"]), list(call.get("args", []))),
        )


@dataclass(frozen=True)
class Execution:
    """A program and its runs (at least one)."""

    code: str
    runs: tuple[Run, ...] = (Run(),)
    language: str = "python"

    def to_wire(self) -> dict[str, Any]:
        return {"language": self.language, "code": self.code, "runs": [run.to_wire() for run in self.runs]}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Execution:
        runs = data.get("runs")
        if not isinstance(data.get("code"), str) or not isinstance(runs, list) or not runs:
            raise ValueError("an execution needs code (a string) and runs (a non-empty list)")
        return cls(
            code=data["code"],
            runs=tuple(Run.from_wire(run) for run in runs),
            language=str(data.get("language", "python")),
        )


class Outcome(StrEnum):
    """How a run ended. Only OK can pass a test; the others say why it failed."""

    OK = "ok"  # exited with status 0
    ERROR = "error"  # exited with another status (an exception, sys.exit(n), a missing function)
    WALL_TIMEOUT = "wall_timeout"  # still running at Limits.wall_seconds: every process of the run was killed
    CPU_TIMEOUT = "cpu_timeout"  # used Limits.cpu_seconds of CPU time (RLIMIT_CPU)
    MEMORY = "memory"  # an allocation failed under Limits.memory_mb (RLIMIT_AS)
    OUTPUT_LIMIT = "output_limit"  # wrote more than Limits.output_bytes to stdout, stderr or its return value: killed
    SIGNALED = "signaled"  # ended by a signal the sandbox did not send (a crash, its own kill)
    SKIPPED = "skipped"  # not started: an earlier run of the execution hit the wall-clock or CPU limit
    SANDBOX_ERROR = "sandbox_error"  # the sandbox could not run it (see ExecutionResult.error)


TIME_LIMITS = frozenset({Outcome.WALL_TIMEOUT, Outcome.CPU_TIMEOUT})
"""Outcomes after which the execution's remaining runs are skipped: a slow program costs one limit, not one per run."""


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    exit_code: int | None = None  # the status it exited with; None when a signal ended it
    signal: int | None = None  # the signal that ended it
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0  # user + system time of the run's first process
    stdout: str = ""  # UTF-8, undecodable bytes replaced; at most Limits.output_bytes
    stderr: str = ""
    returned: str | None = None  # with a Call: the function's return value as JSON text
    truncated: bool = False  # stdout, stderr or the return value was cut at Limits.output_bytes

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> RunResult:
        return cls(**{**data, "outcome": Outcome(data["outcome"])})


@dataclass(frozen=True)
class ExecutionResult:
    runs: tuple[RunResult, ...]
    error: str | None = None  # why the sandbox could not run the execution (every run is then SANDBOX_ERROR)

    def to_wire(self) -> dict[str, Any]:
        return {"runs": [run.to_wire() for run in self.runs], "error": self.error}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ExecutionResult:
        return cls(runs=tuple(RunResult.from_wire(run) for run in data["runs"]), error=data.get("error"))

    @classmethod
    def failed(cls, execution: Execution, error: str) -> ExecutionResult:
        """Every run of `execution` as SANDBOX_ERROR with `error`."""
        return cls(runs=tuple(RunResult(Outcome.SANDBOX_ERROR) for _ in execution.runs), error=error)
