"""Tools that run the policy's programs in the job's sandbox pool (``rollout.agent.sandbox``): ``python``.

They run in the tool workers (:mod:`kuberl.trainer.rollout.tools`), which reach the pool announced to the driver's
processes (:mod:`kuberl.trainer.sandboxes`). Standard library and :mod:`kuberl.sandbox.client` only: the workers must
start fast, so not even :mod:`kuberl.api` is imported here.
"""

from __future__ import annotations

import functools

from kuberl.sandbox.client import SandboxClient, job_sandbox
from kuberl.sandbox.protocol import Execution, Outcome, RunResult

POOL = "tools"
"""kuberl.api.contract.SANDBOX_TOOLS, the pool of rollout.agent.sandbox (tests/trainer/test_sandbox_tools.py pins it)."""
REQUEST_SECONDS = 600.0
"""The longest a call waits for the pool: the tool's timeoutSeconds (at most 600) kills its worker before."""

ENDINGS = {
    Outcome.WALL_TIMEOUT: "killed: past the wall-clock limit",
    Outcome.CPU_TIMEOUT: "killed: past the CPU-time limit",
    Outcome.MEMORY: "MemoryError: past the memory limit",
    Outcome.OUTPUT_LIMIT: "killed: too much output",
}
"""How a run that failed ended, in the words the policy reads after its output (others: the exit status)."""


@functools.cache
def tools_sandbox() -> SandboxClient:
    """The pool, once per worker; a call answers one program at a time."""
    return job_sandbox(POOL, REQUEST_SECONDS)


def python(code: str) -> str:
    """Run ``code`` as a Python program (the interpreter's standard library, no network, no files but its own) in
    the job's sandbox pool; its stdout, then its stderr, then how it ended unless it exited with status 0."""
    result = tools_sandbox().execute(Execution(str(code)))
    if result.error is not None:
        raise RuntimeError(f"the sandbox could not run the program: {result.error}")
    return observation(result.runs[0])


def observation(run: RunResult) -> str:
    parts = [text.rstrip("\n") for text in (run.stdout, run.stderr) if text]
    if run.truncated:
        parts.append("[output cut]")
    if run.outcome is not Outcome.OK:
        parts.append(f"[{ending(run)}]")
    return "\n".join(parts)


def ending(run: RunResult) -> str:
    if run.outcome in ENDINGS:
        return ENDINGS[run.outcome]
    return f"exit status {run.exit_code}" if run.exit_code is not None else f"killed by signal {run.signal}"
