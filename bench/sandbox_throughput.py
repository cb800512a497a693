"""Sandbox throughput: executions of a small test suite per second per sandbox CPU, and the latency a step of
batch 256 gains from scoring its responses in the sandbox.

    .venv/bin/python bench/sandbox_throughput.py [--executions 64] [--batch 256] [--json bench/results/sandbox.json]

The workload is a code-contest answer (read numbers, print their sum) graded on 5 stdin tests, as the
`code_tests` reward runs it: one execution per response, each test a fresh start of the program. Three ways, in
the same run of this script, with `concurrency` executions at once (default: this machine's CPU count):

- baseline: the same 5 runs per execution as bare `python -I -S -c PROGRAM` processes, no isolation at all;
- local: `kuberl.sandbox.executor.Executor` with namespaces (what `kuberl run` uses);
- pod: the execution server in `tests.sandbox.pod`'s stand-in for a sandbox pod (pid 1, no namespaces, an
  unprivileged uid, driven over HTTP on a Unix socket), as the trainer drives a pool (root only).

Per way: executions per second (wall clock) and per CPU-second (user + system time of every process it started:
robust on a shared machine), their ratio to the baseline, and the time a batch of `--batch` executions takes on
`concurrency` sandbox CPUs, i.e. the latency added to a step whose rewards run in the sandbox.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("api", "sandbox", "."):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from kuberl.sandbox import isolation  # noqa: E402
from kuberl.sandbox.client import execute_all  # noqa: E402
from kuberl.sandbox.executor import Executor  # noqa: E402
from kuberl.sandbox.grading import Case, passed  # noqa: E402
from kuberl.sandbox.protocol import Execution, Limits, Run  # noqa: E402

PROGRAM = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n"
CASES = [Case(Run(stdin=f"{i} {i * 7} {i * 13}\n"), f"{i * 21}\n") for i in range(5)]
LIMITS = Limits(wall_seconds=10, cpu_seconds=5, memory_mb=256, processes=8, disk_mb=8)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def baseline_execution(_: int) -> bool:
    """The suite without a sandbox: each test a bare interpreter started on the program."""
    ok = True
    for case in CASES:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", PROGRAM], input=case.run.stdin, capture_output=True, text=True
        )
        ok &= done.stdout == case.expected
    return ok


def measure(name: str, run_all: Callable[[int], Sequence[bool]], executions: int, cpu_of: Callable[[], float]) -> dict:
    run_all(2)  # warm: the page cache, the first interpreter start
    cpu_before, started = cpu_of(), time.perf_counter()
    verdicts = run_all(executions)
    wall, cpu = time.perf_counter() - started, cpu_of() - cpu_before
    assert all(verdicts), f"{name}: {verdicts.count(False)} executions failed their tests"
    return {"way": name, "executions": executions, "wall_s": wall, "cpu_s": cpu}


def sandbox_runner(sandbox: object) -> Callable[[int], list[bool]]:
    execution = Execution(PROGRAM, tuple(case.run for case in CASES))

    def run_all(count: int) -> list[bool]:
        results = execute_all(sandbox, [execution] * count)  # type: ignore[arg-type]
        return [all(passed(c, r) for c, r in zip(CASES, result.runs, strict=True)) for result in results]

    return run_all


def tree_cpu(pid: int) -> Callable[[], float]:
    """CPU time of process `pid`, of the children it reaped and of those it has now (a fork server and its jails;
    the pod stand-in's server and its fork server)."""

    def read() -> float:
        total = 0.0
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if int(entry) == pid or int(fields[1]) == pid:
                    total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        return total

    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    n, concurrency = args.executions, args.concurrency
    rows = []
    with ThreadPoolExecutor(concurrency) as pool:
        rows.append(measure("baseline", lambda k: list(pool.map(baseline_execution, range(k))), n, children_cpu))
    chosen = isolation.decide("namespaces", LIMITS)
    executor = Executor(LIMITS, concurrency, chosen.mode)
    try:
        rows.append(
            measure(f"local ({chosen.mode})", sandbox_runner(executor), n, tree_cpu(executor.forks.process.pid))
        )
    finally:
        executor.close()
    if os.geteuid() == 0:
        from tests.sandbox.pod import start_pod

        workdir = Path(tempfile.mkdtemp(prefix="kuberl-pod-"))
        pod = start_pod(LIMITS, concurrency, workdir)
        try:
            server = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == pod.process.pid]
            rows.append(measure("pod (process)", sandbox_runner(pod.client), n, tree_cpu(int(server[0].name))))
        finally:
            pod.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    base = rows[0]
    print(f"{n} executions of {len(CASES)} tests each, {concurrency} at once, load average {os.getloadavg()[0]:.1f}")
    print(
        f"{'way':<16} {'exec/s':>8} {'exec/CPU-s':>11} {'CPU-s/exec':>11} {'vs baseline':>12} {'batch ' + str(args.batch):>10}"
    )
    for row in rows:
        row["per_second"] = row["executions"] / row["wall_s"]
        row["per_cpu_second"] = row["executions"] / row["cpu_s"]
        row["cpu_ratio_to_baseline"] = (row["cpu_s"] / row["executions"]) / (base["cpu_s"] / base["executions"])
        row[f"batch_{args.batch}_s"] = args.batch * row["cpu_s"] / row["executions"] / concurrency
        print(
            f"{row['way']:<16} {row['per_second']:>8.1f} {row['per_cpu_second']:>11.1f} "
            f"{1000 * row['cpu_s'] / row['executions']:>9.1f}ms {row['cpu_ratio_to_baseline']:>11.2f}x "
            f"{row[f'batch_{args.batch}_s']:>9.1f}s"
        )
    if args.json:
        args.json.write_text(json.dumps({"concurrency": concurrency, "load": os.getloadavg(), "rows": rows}, indent=2))


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return -1


if __name__ == "__main__":
    main()
