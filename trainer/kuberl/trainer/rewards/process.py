"""A user's reward function runs in a process of its own (:class:`RewardProcess`), so that a batch past
``reward.timeoutSeconds`` can be killed wherever it is stuck: a Python loop, a sleep, C code holding the GIL.

That process leads a process group of its own, so that what the function starts goes with it: at the timeout, on a
crash and at shutdown the whole group is killed; and its output (its children's too) reaches the driver's log
through a pipe that passes at most :data:`OUTPUT_BYTES_PER_BATCH` per batch, then one note of what it dropped."""

import multiprocessing
import os
import signal
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from kuberl.trainer.rewards.code_tests import CODE_TESTS_BUILTINS, CodeTestsScorer
from kuberl.trainer.rewards.functions import (
    BUILTINS,
    LOAD_SECONDS,
    NonFiniteRewardError,
    RewardFunctionError,
    RewardFunctionLoadError,
    RewardInput,
    RewardOutput,
    RewardTimeoutError,
    describe,
    load_reward_function,
)
from kuberl.trainer.rewards.scoring import InProcessScorer, RewardPolicy

OUTPUT_BYTES_PER_BATCH = 65536
"""What a user's reward function (and what it starts) may print per batch into the driver's log."""
CRASH_POLL_SECONDS = 0.5
"""How often the driver looks whether the reward process still lives while it waits for a batch."""
RAISED_IN_PROCESS: dict[str, type[RewardFunctionError]] = {
    cls.__name__: cls for cls in (RewardFunctionError, NonFiniteRewardError)
}


END_OF_BATCH = b"\0kuberl:end-of-batch\0"
"""Written into the output pipe at the end of a batch (one write under PIPE_BUF: never split by another writer's),
so that the reader charges what the batch printed before it to the batch, however far the reader lags behind."""
END_OF_BATCH_WAIT_SECONDS = 10.0
"""How long the end of a batch waits for the reader to reach its marker."""


class OutputLimit:
    """This process's stdout and stderr, and its children's (they inherit the descriptors), through a pipe whose
    reader passes at most OUTPUT_BYTES_PER_BATCH per batch to the driver's stderr and counts the rest; each batch
    ends with one note of what it dropped. A function printing in a loop cannot flood the job's log."""

    def __init__(self) -> None:
        self.sink = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self.read = read
        self.budget = OUTPUT_BYTES_PER_BATCH
        self.dropped = 0
        self.batch_dropped = 0
        self.batch_ended = threading.Event()
        threading.Thread(target=self.pump, name="kuberl-reward-output", daemon=True).start()

    def pump(self) -> None:
        pending = b""
        while chunk := os.read(self.read, 65536):
            pending += chunk
            while END_OF_BATCH in pending:
                before, _, pending = pending.partition(END_OF_BATCH)
                self.show(before)
                self.batch_dropped, self.dropped, self.budget = self.dropped, 0, OUTPUT_BYTES_PER_BATCH
                self.batch_ended.set()
            held = next(
                (n for n in range(len(END_OF_BATCH) - 1, 0, -1) if pending.endswith(END_OF_BATCH[:n])), 0
            )  # the start of a marker that the next read completes
            self.show(pending[: len(pending) - held])
            pending = pending[len(pending) - held :]

    def show(self, output: bytes) -> None:
        shown = output[: self.budget]
        self.budget -= len(shown)
        self.dropped += len(output) - len(shown)
        if shown:
            os.write(self.sink, shown)

    def end_batch(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.batch_ended.clear()
        os.write(1, END_OF_BATCH)
        if not self.batch_ended.wait(END_OF_BATCH_WAIT_SECONDS):
            return  # the reader lags that far behind (a blocked log): this batch goes without its note
        if self.batch_dropped:
            note = (
                f"[kuberl] the reward function's output was cut: {self.batch_dropped} more bytes in this batch were "
                f"not shown (at most {OUTPUT_BYTES_PER_BATCH} per batch)\n"
            )
            os.write(self.sink, note.encode())


def serve(name: str, policy: RewardPolicy, conn: Connection) -> None:
    """The reward process: lead a process group of its own, limit its output, load ``name``, then score each batch
    received until the driver closes the pipe. Replies ``("ok", outputs)`` or ``("error", class name, message)``."""
    os.setsid()  # the group the driver kills: this process and whatever the function starts
    output = OutputLimit()
    try:
        fn = load_reward_function(name)
    except Exception as e:
        conn.send(("error", type(e).__name__, str(e)))
        return
    conn.send(("ok", describe(fn)))
    while True:
        try:
            samples = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[Any, ...] = ("ok", InProcessScorer(fn, policy).score(samples))
        except Exception as e:
            reply = ("error", type(e).__name__, str(e))
        output.end_batch()
        conn.send(reply)


def kill_group(process: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL the reward process's group: the process and everything the function started that stayed in it."""
    if process.pid is None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # gone already (or not yet a group leader: kill it alone)
        if process.is_alive():
            process.kill()


class RewardProcess:
    """A user's reward function in a spawned process; a batch not scored within the timeout kills it.

    The process is not a daemon, so the function may start processes of its own (a pool, a sandbox); its process
    group, those included, is killed by :meth:`close`, when this object is collected, at a timeout and when the
    process dies (a crash is reported at once, even when a child still holds the pipe open).
    """

    def __init__(self, name: str, policy: RewardPolicy) -> None:
        self.name = name
        self.policy = policy
        context = multiprocessing.get_context("spawn")  # no fork of a driver that runs Ray's threads
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(name, policy, child), name="kuberl-reward", daemon=False)
        self.process.start()
        child.close()
        self.finalizer = weakref.finalize(self, kill_group, self.process)
        status, *reply = self.receive("load", max(LOAD_SECONDS, policy.timeout_seconds))
        if status == "error":
            self.close()
            raise RewardFunctionLoadError(reply[-1])
        self.description: str = reply[0]

    def receive(self, doing: str, timeout: float) -> tuple[Any, ...]:
        """The process's reply; a crash is reported within CRASH_POLL_SECONDS of the process's exit (its exit status,
        not the pipe's end or the process sentinel: a child it forked may hold both open)."""
        deadline = time.monotonic() + timeout
        while not self.conn.poll(min(CRASH_POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
            if not self.process.is_alive():
                self.crashed(doing)
            if time.monotonic() >= deadline:
                self.close()
                raise RewardTimeoutError(
                    f"reward function {self.name!r} did not {doing} within {timeout:g} s (reward.timeoutSeconds = "
                    f"{self.policy.timeout_seconds:g}); its process was killed: a hung function, a deadlock or a "
                    "call stuck in C. Raise reward.timeoutSeconds if the function is only slow"
                )
        try:
            reply: tuple[Any, ...] = self.conn.recv()
        except EOFError:
            self.crashed(doing)
        return reply

    def crashed(self, doing: str) -> NoReturn:
        self.process.join(timeout=5)
        code = self.process.exitcode
        self.close()
        raise RewardFunctionError(
            f"reward function {self.name!r}: its process exited with code {code} while trying to {doing} "
            "(a crash in native code, os._exit, or the OOM killer); what it started was killed with it"
        )

    def score(self, samples: list[RewardInput]) -> list[RewardOutput]:
        if not self.process.is_alive():
            raise RewardFunctionError(f"reward function {self.name!r}: its process is gone (killed earlier)")
        self.conn.send(samples)
        status, *reply = self.receive(f"score a batch of {len(samples)} samples", self.policy.timeout_seconds)
        if status == "error":
            kind, message = reply
            raise RAISED_IN_PROCESS.get(kind, RewardFunctionError)(message)
        outputs: list[RewardOutput] = reply[0]
        return outputs

    def close(self) -> None:
        self.conn.close()
        self.finalizer()
        self.process.join(timeout=5)


RewardScorer = InProcessScorer | CodeTestsScorer | RewardProcess


def make_scorer(name: str, policy: RewardPolicy) -> RewardScorer:
    """Builtins in the driver (those that run programs through the job's sandbox pool by batches), anything else in a
    :class:`RewardProcess`."""
    if name in CODE_TESTS_BUILTINS:
        return CodeTestsScorer(name, policy)
    if name in BUILTINS:
        return InProcessScorer(BUILTINS[name], policy)
    return RewardProcess(name, policy)
