"""The jail: one execution's supervisor, and the harness its program runs in.

The executor starts one `python -I -S` with this module as a fork server (`fork_server`); for every execution it
forks a jail, which reads the request (confinement, limits, execution) on its fd 0 and writes the result on its
fd 1. Standard library only, imported before any untrusted code runs.

Processes, with namespaces (`Mode.ROOT`, `Mode.USER`):

    jail (outside)          unshare(mount, network, pid, ipc, uts[, user]); relays the result
     └─ supervisor          pid 1 of the new pid namespace: builds the filesystem, chroots, starts each run,
         │                  enforces the wall clock and output caps, kills the run's every process after it
         └─ program         setsid, rlimits, an unprivileged uid (or no capabilities), no new privileges, then the
                            user's code in this interpreter (no second interpreter start)

The program sees: the interpreter's installation and /usr read-only, /dev/{null,zero,full,random,urandom}, its own
/proc, a fresh tmpfs `/sandbox` of `Limits.disk_mb` as working directory (and /tmp), a network namespace with a
loopback device that is down, and no process outside its namespace: it cannot signal the supervisor (pid 1 of its
namespace, deaf to SIGKILL from inside) nor see the server. When the supervisor exits the kernel kills whatever is
left in the namespace.

Without namespaces (`Mode.PROCESS`: a Kubernetes pod, whose seccomp profile forbids unshare) the jail is the
supervisor itself: a child subreaper, so that a program's escaped descendants are re-parented to it and killed after
the run; the pod provides the filesystem and network isolation (docs/security.md).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time
import traceback
import types
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, NoReturn

from kuberl.sandbox import linux
from kuberl.sandbox.protocol import (
    TIME_LIMITS,
    Execution,
    ExecutionResult,
    Limits,
    Outcome,
    Run,
    RunResult,
)

WORKDIR = "/sandbox"  # the program's working directory inside the namespaces
PROGRAM = "solution.py"  # the file the program's code is written to (tracebacks show its lines)
DEVICES = ("null", "zero", "full", "random", "urandom")
MEMORY_EXIT = 86  # the harness's exit status after a MemoryError: the supervisor reports Outcome.MEMORY
SETUP_EXIT = 87  # the harness could not confine itself: the run is a sandbox error, the program never ran
NAMESPACES = linux.CLONE_NEWNS | linux.CLONE_NEWNET | linux.CLONE_NEWPID | linux.CLONE_NEWIPC | linux.CLONE_NEWUTS
READ_SIZE = 65536
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The folder holding `kuberl/sandbox/`: the executor puts it on the jail's sys.path, the program does not get it."""


class Mode(StrEnum):
    """How runs are confined; the executor decides it once at start-up (kuberl.sandbox.isolation)."""

    ROOT = "root"  # namespaces; a root server runs each program as the unprivileged `Confinement.uid`
    USER = "user"  # namespaces inside a new user namespace; the program keeps the server's uid, no capabilities
    PROCESS = "process"  # no namespaces: rlimits, a process group, a subreaper, a working directory (and
    # `Confinement.uid` when the server is root)


@dataclass(frozen=True)
class Confinement:
    mode: Mode
    directory: str  # namespaces: an empty directory the jail's root is mounted on; PROCESS: the working directory
    uid: int | None = None  # the uid (and gid) a root server runs the program as; None: the server's own
    binds: tuple[str, ...] = ()  # host paths the program sees read-only (namespaces); a symlink is copied as one

    def to_wire(self) -> dict[str, Any]:
        return {**asdict(self), "binds": list(self.binds)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Confinement:
        return cls(Mode(data["mode"]), data["directory"], data.get("uid"), tuple(data.get("binds", ())))

    @property
    def workdir(self) -> str:
        return self.directory if self.mode is Mode.PROCESS else WORKDIR


# --- the supervisor ------------------------------------------------------------------------------------------------


def confine(confinement: Confinement, limits: Limits, execution: Execution) -> ExecutionResult:
    """Run every run of `execution` under `confinement` and `limits`."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as pid 1, a default disposition makes it deaf to the program
    if confinement.mode is Mode.PROCESS:
        linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)
        return supervise(confinement, limits, execution)
    linux.unshare(NAMESPACES | (linux.CLONE_NEWUSER if confinement.mode is Mode.USER else 0))
    if confinement.mode is Mode.USER:
        _map_own_ids()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pid 1 of the new namespace
        os.close(reader)
        status = 0
        try:
            linux.prctl(linux.PR_SET_DUMPABLE, 0)
            _build_root(confinement, limits)
            result = supervise(confinement, limits, execution)
        except BaseException as exc:
            result, status = ExecutionResult.failed(execution, f"the jail could not be built: {exc}"), 1
        _write_all(writer, json.dumps(result.to_wire()).encode())
        os._exit(status)
    os.close(writer)
    data = _read_all(reader)
    _, wait_status = os.waitpid(pid, 0)
    try:
        return ExecutionResult.from_wire(json.loads(data))
    except (ValueError, KeyError, TypeError):
        return ExecutionResult.failed(
            execution, f"the jail's supervisor ended ({_describe(wait_status)}) without a result"
        )


def supervise(confinement: Confinement, limits: Limits, execution: Execution) -> ExecutionResult:
    results: list[RunResult] = []
    for run in execution.runs:
        if any(result.outcome in TIME_LIMITS for result in results):
            results.append(RunResult(Outcome.SKIPPED))
            continue
        _fresh_workdir(confinement, execution.code)
        results.append(_run_once(confinement, limits, execution, run))
    return ExecutionResult(runs=tuple(results))


def _run_once(confinement: Confinement, limits: Limits, execution: Execution, run: Run) -> RunResult:
    stdin = os.memfd_create("stdin")
    os.write(stdin, run.stdin.encode())
    os.lseek(stdin, 0, os.SEEK_SET)
    pipes = [os.pipe() for _ in range(3)]  # stdout, stderr, the call's return value
    process_base = _process_base(confinement)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _become_program(confinement, limits, execution, run, stdin, [w for _, w in pipes], process_base)
    os.close(stdin)
    for _, w in pipes:
        os.close(w)
    outputs = [bytearray() for _ in pipes]
    outcome: Outcome | None = None
    pidfd = os.pidfd_open(pid)
    deadline = started + limits.wall_seconds
    with selectors.DefaultSelector() as selector:
        for index, (r, _) in enumerate(pipes):
            os.set_blocking(r, False)
            selector.register(r, selectors.EVENT_READ, index)
        selector.register(pidfd, selectors.EVENT_READ, None)
        exited = False
        while not exited and outcome is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome = Outcome.WALL_TIMEOUT
                break
            for key, _ in selector.select(remaining):
                if key.data is None:
                    exited = True
                elif not _drain(key.fd, outputs[key.data], limits.output_bytes, selector):
                    outcome = Outcome.OUTPUT_LIMIT
        _, status, usage = os.wait4(pid, 0) if exited else _kill_and_wait(pid)
        wall = time.monotonic() - started
        _kill_rest(confinement, pid)
        for key in list(selector.get_map().values()):
            if key.data is not None and not _drain(key.fd, outputs[key.data], limits.output_bytes, selector):
                outcome = outcome or Outcome.OUTPUT_LIMIT
    os.close(pidfd)
    for r, _ in pipes:
        os.close(r)
    cpu = usage.ru_utime + usage.ru_stime
    stdout, stderr, returned = (bytes(o[: limits.output_bytes]).decode("utf-8", "replace") for o in outputs)
    return RunResult(
        outcome=outcome or _outcome(status, cpu, limits, stderr),
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        wall_seconds=round(wall, 4),
        cpu_seconds=round(cpu, 4),
        stdout=stdout,
        stderr=stderr,
        returned=returned if run.call is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else None,
        truncated=any(len(o) > limits.output_bytes for o in outputs),
    )


def _process_base(confinement: Confinement) -> int:
    """Tasks RLIMIT_NPROC finds for the program's uid before it starts: the limit is this plus Limits.processes.
    Linux counts them per uid (per user namespace), so without namespaces and a uid of its own this is what
    /proc shows of the server's uid: the pod's processes, but not another pod's of the same uid on that node."""
    if confinement.mode is Mode.USER:
        return 1  # the supervisor, which shares the program's uid in the namespace
    if confinement.mode is Mode.ROOT:
        return 0  # a uid of the execution's own, in a pid namespace of its own
    return _tasks_of(os.getuid() if confinement.uid is None else confinement.uid)


def _drain(fd: int, into: bytearray, cap: int, selector: selectors.BaseSelector) -> bool:
    """Read what `fd` has; False once more than `cap` bytes came (the rest is not read). Unregisters it at EOF."""
    while True:
        try:
            chunk = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return True
        if not chunk:
            selector.unregister(fd)
            return True
        into += chunk[: cap + 1 - len(into)]
        if len(into) > cap:
            selector.unregister(fd)
            return False


def _outcome(status: int, cpu: float, limits: Limits, stderr: str) -> Outcome:
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code == SETUP_EXIT:
            return Outcome.SANDBOX_ERROR
        if code == MEMORY_EXIT:
            return Outcome.MEMORY
        return Outcome.OK if code == 0 else Outcome.ERROR
    sig = os.WTERMSIG(status)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu_seconds):
        return Outcome.CPU_TIMEOUT
    if sig == signal.SIGABRT and "MemoryError" in stderr:
        return Outcome.MEMORY
    return Outcome.SIGNALED


def _kill_and_wait(pid: int) -> tuple[int, int, resource.struct_rusage]:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return os.wait4(pid, 0)


def _kill_rest(confinement: Confinement, program: int) -> None:
    """Kill and reap every process the run left. As pid 1 of its namespace the supervisor kills all others at once;
    without one it kills the program's process group, then whatever was re-parented to it, until none is left."""
    if confinement.mode is not Mode.PROCESS:
        with contextlib.suppress(ProcessLookupError):  # none left
            os.kill(-1, signal.SIGKILL)
        _reap_all()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(program, signal.SIGKILL)
    me = os.getpid()
    while True:
        for child in children_of(me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _reap_all() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _proc_stats() -> list[tuple[int, int, list[str]]]:
    """(pid, parent pid, the rest of /proc/PID/stat) of every process this /proc shows."""
    stats = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
        stats.append((int(entry), int(fields[1]), fields))
    return stats


def children_of(parent: int) -> list[int]:
    return [pid for pid, ppid, _ in _proc_stats() if ppid == parent]


def _tasks_of(uid: int) -> int:
    """Threads of processes whose real uid is `uid`, as far as this /proc shows (RLIMIT_NPROC counts threads)."""
    count = 0
    for pid, _, fields in _proc_stats():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                count += int(fields[17])  # num_threads
        except (OSError, IndexError, ValueError):
            continue
    return count


# --- the jail's filesystem (namespaces) ----------------------------------------------------------------------------


def _map_own_ids() -> None:
    """In a new user namespace, keep this process's uid and gid (the only mapping an unprivileged one may write)."""
    uid, gid = os.getuid(), os.getgid()
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _build_root(confinement: Confinement, limits: Limits) -> None:
    """Mount the program's filesystem on `confinement.directory` and chroot into it (the mount namespace is private:
    nothing of this is visible outside, and it vanishes with the namespace)."""
    root = confinement.directory
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)
    linux.mount("tmpfs", root, "tmpfs", linux.MS_NOSUID, "size=1m,mode=0755")
    for path in confinement.binds:
        target = root + path
        if os.path.islink(path):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
            _bind_read_only(path, target)
    os.mkdir(root + "/dev")
    for device in DEVICES:
        target = f"{root}/dev/{device}"
        open(target, "w").close()
        linux.mount(f"/dev/{device}", target, None, linux.MS_BIND)
    os.mkdir(root + "/proc")
    linux.mount("proc", root + "/proc", "proc", linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC)
    os.mkdir(root + WORKDIR)
    owner = confinement.uid if confinement.mode is Mode.ROOT else os.getuid()
    linux.mount(
        "tmpfs",
        root + WORKDIR,
        "tmpfs",
        linux.MS_NOSUID | linux.MS_NODEV,
        f"size={limits.disk_mb}m,mode=0755,uid={owner},gid={owner if confinement.mode is Mode.ROOT else os.getgid()}",
    )
    os.symlink(WORKDIR.lstrip("/"), root + "/tmp")
    linux.mount("none", root, None, linux.MS_REMOUNT | linux.MS_RDONLY | linux.MS_NOSUID)
    os.chroot(root)
    os.chdir("/")


# statvfs flags a read-only remount of a bind must keep (a user namespace may not clear them)
_KEPT_FLAGS = (
    (os.ST_NOSUID, linux.MS_NOSUID),
    (os.ST_NODEV, linux.MS_NODEV),
    (os.ST_NOEXEC, linux.MS_NOEXEC),
    (os.ST_NOATIME, 0x400),
    (os.ST_NODIRATIME, 0x800),
    (os.ST_RELATIME, 0x200000),
)


def _bind_read_only(source: str, target: str) -> None:
    linux.mount(source, target, None, linux.MS_BIND | linux.MS_REC)
    kept = os.statvfs(source).f_flag
    flags = linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY
    for st, ms in _KEPT_FLAGS:
        if kept & st:
            flags |= ms
    linux.mount("none", target, None, flags)


def _fresh_workdir(confinement: Confinement, code: str) -> None:
    """Empty the working directory (a previous run may have left anything) and write the program into it."""
    workdir = confinement.workdir
    for entry in os.scandir(workdir):
        _remove(entry.path)
    with open(os.path.join(workdir, PROGRAM), "w", encoding="utf-8") as f:
        f.write(code)
    if confinement.mode is Mode.PROCESS and confinement.uid is not None:
        os.chown(workdir, confinement.uid, confinement.uid)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)  # a program may have taken its own rights away
        for entry in os.scandir(path):
            _remove(entry.path)
        os.rmdir(path)
    else:
        os.unlink(path)


# --- the program ---------------------------------------------------------------------------------------------------


def _become_program(
    confinement: Confinement,
    limits: Limits,
    execution: Execution,
    run: Run,
    stdin: int,
    outputs: list[int],
    process_base: int,
) -> NoReturn:
    """In the forked child: confine this process, then run the user's code in it. Never returns."""
    try:
        os.setsid()
        os.dup2(stdin, 0)
        for fd, pipe in enumerate(outputs, start=1):  # 1 stdout, 2 stderr, 3 the call's return value
            os.dup2(pipe, fd)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))
        cpu = limits.cpu_seconds
        for limit, value in (
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_AS, (limits.memory_mb << 20,) * 2),
            (resource.RLIMIT_NPROC, (process_base + limits.processes,) * 2),
            (resource.RLIMIT_FSIZE, (limits.disk_mb << 20,) * 2),
            (resource.RLIMIT_NOFILE, (limits.open_files,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ):
            resource.setrlimit(limit, value)
        if confinement.mode is Mode.USER:
            linux.drop_capabilities()
        elif confinement.uid is not None:
            os.setgroups([])
            os.setgid(confinement.uid)
            os.setuid(confinement.uid)
        linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        os.chdir(confinement.workdir)
        _prefer_for_oom_killer()
        os.environ.clear()
        os.environ.update(
            {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": confinement.workdir, "TMPDIR": confinement.workdir}
        )
    except BaseException as exc:
        os.write(2, f"the sandbox could not confine the program: {exc}\n".encode())
        os._exit(SETUP_EXIT)
    os._exit(_run_python(execution.code, run, confinement.workdir))


def _prefer_for_oom_killer() -> None:
    """Make the program the out-of-memory killer's first choice rather than the server (raising it needs no rights)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _run_python(code: str, run: Run, workdir: str) -> int:
    """Run `code` as the `__main__` of this interpreter (and `run.call`); the exit status Python would give."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.argv = [PROGRAM]
    sys.path = [workdir, *(p for p in sys.path if p != PACKAGE_ROOT)]
    for name in [m for m in sys.modules if m == "kuberl" or m.startswith("kuberl.")]:
        del sys.modules[name]
    main = types.ModuleType("__main__")
    main.__file__ = os.path.join(workdir, PROGRAM)
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(compile(code, main.__file__, "exec"), main.__dict__)
        if run.call is not None:
            function = main.__dict__.get(run.call.function)
            if not callable(function):
                raise NameError(f"the program defines no function {run.call.function!r}")
            returned = json.dumps(function(*run.call.args), default=repr)
            _write_all(3, returned.encode())
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except MemoryError:
        os.write(2, b"MemoryError\n")
        status = MEMORY_EXIT
    except BaseException as exc:  # the traceback Python would print, without this harness's frame
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = status or 1
    return status


def _exit_status(code: object) -> int:
    """What `sys.exit(code)` makes the interpreter exit with."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# --- plumbing ------------------------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, READ_SIZE):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _reap_jails(_signal: int, _frame: object) -> None:
    """Reap the jails that ended (their results come by pipe; their CPU time adds up in this process's)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def serve_request() -> None:
    """One jail: the request on fd 0, the result on fd 1."""
    request = json.loads(_read_all(0))
    execution = Execution.from_wire(request["execution"])
    try:
        result = confine(Confinement.from_wire(request["confinement"]), Limits.from_wire(request["limits"]), execution)
    except OSError as exc:
        result = ExecutionResult.failed(execution, f"the jail could not confine the execution: {exc}")
    _write_all(1, json.dumps(result.to_wire()).encode())


def fork_server(channel_fd: int) -> None:
    """Fork a jail per message on `channel_fd` (a SOCK_SEQPACKET socket) and answer its pid. A message carries two
    descriptors, the request's pipe and the result's, which become the jail's fd 0 and 1; the jail starts from
    this interpreter, its modules already imported, instead of starting one (docs/rewards.md, throughput)."""
    channel = socket.socket(fileno=channel_fd)
    signal.signal(signal.SIGCHLD, _reap_jails)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 16, 2)
        except OSError:
            return
        if not message or len(fds) != 2:
            return  # the executor closed its end
        pid = os.fork()
        if pid == 0:
            channel.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()  # its own process group: the executor kills the jail and its supervisor together
            os.dup2(fds[0], 0)
            os.dup2(fds[1], 1)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            status = 0
            try:
                serve_request()
            except BaseException:
                status = 1
            os._exit(status)
        for fd in fds:
            os.close(fd)
        channel.sendall(pid.to_bytes(4, "little"))
