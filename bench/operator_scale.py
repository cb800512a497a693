"""Operator scale benchmark: N RLJobs created at once against the e2e harness's real kube-apiserver.

    PYTHONPATH=api:operator:trainer:. .venv/bin/python bench/operator_scale.py [--jobs 200] [--workers 16]

Starts etcd + kube-apiserver (e2e/harness.py), the operator as a process (`python -m kuberl.operator
--namespace bench`), then creates the RLJobs from a thread pool as fast as the apiserver takes them, and watches:
- creation → RayJob latency: from the moment the client sent the RLJob's POST to the RayJob's ADDED watch event;
- creation → status latency: until the RLJob's status carries `rayJobName` (the operator finished the reconcile);
- the operator's RSS (VmRSS of its process) before, at peak (sampled every 100 ms) and after; with
  `--delete-after S`, also once every RLJob is deleted (the garbage collector of kube-controller-manager removes
  their children) and S seconds later: what the operator keeps of a burst that is gone; with `--bursts N`, N bursts
  of as many RLJobs one after the other, each deleted before the next: whether a burst adds to what the last kept;
- the apiserver writes per RLJob (POST/PUT/PATCH/DELETE from the apiserver's own `apiserver_request_total`, by
  resource, the client's RLJob POSTs not counted);
- the floor: before the operator starts, a bare client does the essential writes of the same number of RLJobs
  in namespace `bench-floor` from the same number of threads (create the RLJob, its ConfigMap and RayJob as the
  operator renders them, one status patch); burst throughput is reported beside it.
Prints one table; `--json` prints the numbers as JSON as well.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for sub in ("api", "operator", "trainer", "."):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

from kubernetes import client, watch  # noqa: E402

from e2e.harness import Cluster  # noqa: E402
from e2e.operator.crd import require_rljob_crd  # noqa: E402
from e2e.operator.manifests import rljob  # noqa: E402
from e2e.operator.process import OperatorProcess  # noqa: E402
from kuberl.api.spec import RLJobSpec  # noqa: E402
from kuberl.operator.rayjob import render_configmap, render_rayjob  # noqa: E402

NAMESPACE = "bench"
FLOOR_NAMESPACE = "bench-floor"
RLJOBS = ("kuberl.io", "v1alpha1", NAMESPACE, "rljobs")
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def apiserver_writes(cluster: Cluster) -> dict[str, float]:
    """Write requests the apiserver has served so far, by `resource[/subresource]` (its own counter); refused ones
    under `resource[/subresource] <code>`."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = cluster.request("GET", "/metrics")
    assert status == 200, status
    writes: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name.endswith("_total") and labels.get("verb") in WRITE_VERBS:
                key = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
                if labels.get("code", "200").startswith(("4", "5")):  # refused writes (409 conflicts) apart
                    key += f" {labels['code']}"
                writes[key] = writes.get(key, 0.0) + sample.value
    return writes


def floor_run(custom: client.CustomObjectsApi, core: client.CoreV1Api, jobs: int, threads: int) -> float:
    """Seconds a bare client takes for the essential writes of `jobs` RLJobs (RLJob, ConfigMap, RayJob, status)."""
    spec = RLJobSpec.model_validate(rljob("x")["spec"])

    def one(name: str) -> None:
        created = custom.create_namespaced_custom_object(
            "kuberl.io", "v1alpha1", FLOOR_NAMESPACE, "rljobs", rljob(name)
        )
        uid = created["metadata"]["uid"]
        core.create_namespaced_config_map(FLOOR_NAMESPACE, render_configmap(name, FLOOR_NAMESPACE, uid, spec))
        custom.create_namespaced_custom_object(
            "ray.io", "v1", FLOOR_NAMESPACE, "rayjobs", render_rayjob(name, FLOOR_NAMESPACE, uid, spec)
        )
        custom.patch_namespaced_custom_object_status(
            "kuberl.io",
            "v1alpha1",
            FLOOR_NAMESPACE,
            "rljobs",
            name,
            {"status": {"phase": "Pending", "rayJobName": name, "message": "creating the RayJob"}},
            _content_type="application/merge-patch+json",
        )

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, [f"floor-{i:04d}" for i in range(jobs)]))
    return time.monotonic() - t0


def rss_mib(pid: int, field: str = "VmRSS:") -> float:
    """A process's resident set (VmRSS), or its peak over the process's life (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Watcher(threading.Thread):
    """Records the first time each name satisfies `ready(obj)` on a watch of `list_fn`."""

    def __init__(self, list_fn, ready, **kwargs) -> None:
        super().__init__(daemon=True)
        self.list_fn, self.ready, self.kwargs = list_fn, ready, kwargs
        self.seen: dict[str, float] = {}
        self.stop_flag = threading.Event()
        self.started = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.started.set()
            try:  # a fresh list + watch each round: a dropped stream cannot hide an object
                for event in watch.Watch().stream(self.list_fn, timeout_seconds=5, **self.kwargs):
                    obj = event["object"]
                    name = obj["metadata"]["name"]
                    if name not in self.seen and event["type"] in ("ADDED", "MODIFIED") and self.ready(obj):
                        self.seen[name] = time.monotonic()
                    if self.stop_flag.is_set():
                        break
            except Exception as exc:
                print(f"watch error ({type(exc).__name__}: {exc}); watching again", file=sys.stderr)
                time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--client-threads", type=int, default=32, help="threads creating RLJobs")
    parser.add_argument("--workers", type=int, default=16, help="operator --max-workers")
    parser.add_argument("--rate", type=float, default=0.0, help="create RLJobs at this steady rate per s (0: burst)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument(
        "--delete-after",
        type=float,
        metavar="S",
        help="then delete every RLJob and sample the operator's RSS once they are gone and S seconds later",
    )
    parser.add_argument(
        "--bursts",
        type=int,
        default=1,
        help="with --delete-after: create, reconcile and delete the same RLJobs this many times, sampling the RSS "
        "once each burst is gone (a leak grows it burst by burst)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with Cluster(controller_manager=args.delete_after is not None) as cluster:
        require_rljob_crd(cluster)
        api_client = cluster.api_client()
        custom = client.CustomObjectsApi(api_client)
        core = client.CoreV1Api(api_client)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        core.create_namespace({"metadata": {"name": FLOOR_NAMESPACE}})
        floor_s = floor_run(custom, core, args.jobs, args.client_threads)
        log_dir = Path(cluster.workdir) / "operator"
        operator = OperatorProcess(
            kubeconfig=cluster.kubeconfig,
            log_dir=log_dir,
            namespaces=(NAMESPACE,),
            extra_args=("--max-workers", str(args.workers), "--resync-seconds", "0"),
        )
        operator.start()
        time.sleep(1.0)
        pid = operator.popen.pid
        rss_idle = rss_mib(pid)
        pids = {
            "kube-apiserver": next(p.popen.pid for p in cluster._procs if p.name == "kube-apiserver"),
            "etcd": next(p.popen.pid for p in cluster._procs if p.name == "etcd"),
            "operator": pid,
            "benchmark client": os.getpid(),
        }
        cpu_before = {k: cpu_seconds(v) for k, v in pids.items()}
        writes_before = apiserver_writes(cluster)

        rayjobs = Watcher(
            custom.list_namespaced_custom_object,
            lambda o: True,
            group="ray.io",
            version="v1",
            namespace=NAMESPACE,
            plural="rayjobs",
        )
        statuses = Watcher(
            custom.list_namespaced_custom_object,
            lambda o: bool((o.get("status") or {}).get("rayJobName")),
            group="kuberl.io",
            version="v1alpha1",
            namespace=NAMESPACE,
            plural="rljobs",
        )
        rayjobs.start()
        statuses.start()
        rayjobs.started.wait(5)
        statuses.started.wait(5)
        time.sleep(0.5)

        peak = [rss_idle]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], rss_mib(pid))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        names = [f"bench-{i:04d}" for i in range(args.jobs)]
        sent: dict[str, float] = {}

        def create(name: str) -> None:
            if args.rate > 0:  # a steady arrival rate: the i-th RLJob is sent i / rate seconds after the first
                delay = t0 + names.index(name) / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            sent[name] = time.monotonic()
            custom.create_namespaced_custom_object("kuberl.io", "v1alpha1", NAMESPACE, "rljobs", rljob(name))

        t0 = time.monotonic()
        with ThreadPoolExecutor(args.client_threads) as pool:
            list(pool.map(create, names))
        created_s = time.monotonic() - t0
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and (len(rayjobs.seen) < args.jobs or len(statuses.seen) < args.jobs):
            time.sleep(0.1)
        all_done_s = time.monotonic() - t0
        time.sleep(2)
        writes_after = apiserver_writes(cluster)
        sampling.set()
        rss_after = rss_mib(pid)
        cpu_used = {k: round(cpu_seconds(v) - cpu_before[k], 1) for k, v in pids.items()}
        rayjobs.stop_flag.set()
        statuses.stop_flag.set()
        count = len(custom.list_namespaced_custom_object("ray.io", "v1", NAMESPACE, "rayjobs")["items"])
        rljobs = custom.list_namespaced_custom_object("kuberl.io", "v1alpha1", NAMESPACE, "rljobs")["items"]
        with_status = sum(1 for o in rljobs if (o.get("status") or {}).get("rayJobName"))
        metrics = operator.metrics()
        rss_deleted = rss_settled = None
        rss_bursts_deleted: list[float] = []
        if args.delete_after is not None:

            def listed() -> list[dict[str, Any]]:
                return custom.list_namespaced_custom_object(*RLJOBS)["items"]  # type: ignore[no-any-return]

            def delete_all(burst: list[str]) -> float:
                """Deletes the burst's RLJobs and waits until none is left: the operator's RSS then."""
                with ThreadPoolExecutor(args.client_threads) as pool:
                    list(pool.map(lambda n: custom.delete_namespaced_custom_object(*RLJOBS, n), burst))
                deadline = time.monotonic() + args.timeout
                while listed() and time.monotonic() < deadline:
                    time.sleep(1)
                return rss_mib(pid)

            rss_deleted = delete_all(names)
            for b in range(2, args.bursts + 1):  # another burst as large: does it add to what the last one kept?
                burst = [f"bench-{b}-{i:04d}" for i in range(args.jobs)]  # new names: the old RayJobs may remain
                with ThreadPoolExecutor(args.client_threads) as pool:
                    list(pool.map(lambda n: custom.create_namespaced_custom_object(*RLJOBS, rljob(n)), burst))
                deadline = time.monotonic() + args.timeout
                while time.monotonic() < deadline and args.jobs > sum(
                    1 for o in listed() if (o.get("status") or {}).get("rayJobName")
                ):
                    time.sleep(1)
                rss_bursts_deleted.append(delete_all(burst))
            time.sleep(args.delete_after)
            rss_settled = rss_mib(pid)
        rss_hwm = rss_mib(pid, "VmHWM:")
        operator.stop()

    to_rayjob = [rayjobs.seen[n] - sent[n] for n in names if n in rayjobs.seen]
    to_status = [statuses.seen[n] - sent[n] for n in names if n in statuses.seen]
    errors = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("kuberl_operator_reconcile_errors_total")
    )
    durations = {}
    for line in metrics.splitlines():
        for suffix in ("_sum", "_count"):
            prefix = "kuberl_operator_reconcile_duration_seconds" + suffix + '{handler="'
            if line.startswith(prefix):
                handler = line[len(prefix) :].split('"')[0]
                durations.setdefault(handler, {})[suffix[1:]] = float(line.split()[-1])
    handler_mean_s = {
        h: {"runs": int(d["count"]), "mean_s": round(d["sum"] / d["count"], 3)}
        for h, d in durations.items()
        if d.get("count")
    }
    writes = {k: v - writes_before.get(k, 0.0) for k, v in writes_after.items()}
    writes["rljobs"] = writes.get("rljobs", 0.0) - args.jobs  # the benchmark client's own creates
    per_job = {k: round(v / args.jobs, 2) for k, v in sorted(writes.items()) if v > 0}
    throughput = args.jobs / all_done_s
    floor_throughput = args.jobs / floor_s
    result = {
        "jobs": args.jobs,
        "apiserver_writes_per_rljob": {"total": round(sum(per_job.values()), 2), **per_job},
        "burst_rljobs_per_s": round(throughput, 1),
        "floor_rljobs_per_s": round(floor_throughput, 1),
        "burst_vs_floor": round(throughput / floor_throughput, 2),
        "operator_max_workers": args.workers,
        "rayjobs_in_namespace": count,
        "rljobs_with_status": with_status,
        "create_all_s": round(created_s, 2),
        "all_reconciled_s": round(all_done_s, 2),
        "rayjob_latency_s": {
            "p50": round(percentile(to_rayjob, 50), 3),
            "p99": round(percentile(to_rayjob, 99), 3),
            "max": round(max(to_rayjob, default=float("nan")), 3),
            "n": len(to_rayjob),
            "mean": round(statistics.fmean(to_rayjob), 3) if to_rayjob else None,
        },
        "status_latency_s": {
            "p50": round(percentile(to_status, 50), 3),
            "p99": round(percentile(to_status, 99), 3),
            "max": round(max(to_status, default=float("nan")), 3),
            "n": len(to_status),
        },
        "operator_rss_mib": {
            "idle": round(rss_idle, 1),
            "peak": round(peak[0], 1),
            "after": round(rss_after, 1),
            **({} if rss_deleted is None else {"all_deleted": round(rss_deleted, 1)}),
            **{f"burst_{i}_deleted": round(v, 1) for i, v in enumerate(rss_bursts_deleted, start=2)},
            **({"peak_of_all_bursts": round(rss_hwm, 1)} if rss_bursts_deleted else {}),
            **({} if rss_settled is None else {f"{args.delete_after:g}_s_later": round(rss_settled, 1)}),
        },
        "reconcile_errors": errors,
        "handlers": handler_mean_s,
        "cpu_s": cpu_used,
        "host_cpus": os.cpu_count(),
    }
    print(
        f"{args.jobs} RLJobs created in {created_s:.2f} s; all reconciled after {all_done_s:.2f} s; "
        f"{count} RayJobs exist; {with_status} RLJobs have a status; reconcile errors: {errors:g}"
    )
    print(f"{'':24}{'p50':>8}{'p99':>8}{'max':>8}{'n':>6}")
    for label, key in (("creation → RayJob", "rayjob_latency_s"), ("creation → status", "status_latency_s")):
        r = result[key]
        print(f"{label:24}{r['p50']:>8.3f}{r['p99']:>8.3f}{r['max']:>8.3f}{r['n']:>6}")
    print(
        f"apiserver writes per RLJob: {result['apiserver_writes_per_rljob']['total']} "
        f"({', '.join(f'{k} {v}' for k, v in per_job.items())})"
    )
    print(
        f"burst throughput {throughput:.1f} RLJobs/s; floor (bare client: RLJob, ConfigMap, RayJob, one status "
        f"patch) {floor_throughput:.1f} RLJobs/s; ratio {throughput / floor_throughput:.2f}"
    )
    rss = result["operator_rss_mib"]
    print("operator RSS MiB: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in rss.items()))
    print("handler runs (mean s): " + ", ".join(f"{h} {d['runs']} ({d['mean_s']})" for h, d in handler_mean_s.items()))
    print(
        f"CPU seconds during the {all_done_s:.0f} s run on {os.cpu_count()} CPUs: "
        + ", ".join(f"{k} {v}" for k, v in cpu_used.items())
    )
    if args.json:
        print(json.dumps(result, indent=2))
    return 0 if count == args.jobs and len(to_rayjob) == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
