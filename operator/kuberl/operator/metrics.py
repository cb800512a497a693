"""Prometheus metrics of the operator (prometheus-client; kopf has none of its own).

- `kuberl_operator_rljobs{phase}`: RLJobs the operator watches, by phase ("Unknown" before the first status write).
  Computed at scrape time from the objects seen on the watch (`PhaseTracker`), which the watch rebuilds after a
  restart: nothing here outlives the process or needs to.
- `kuberl_operator_reconcile_duration_seconds{handler}`: time spent in each handler.
- `kuberl_operator_reconcile_errors_total{handler}`: handler runs that raised (retried, temporary or permanent).
- `kuberl_operator_restarts_total`: RayJob retries (new Ray clusters after a failure) observed by this process.
- `kuberl_operator_kuberay_supported`: 1 when the installed KubeRay is one kuberl supports (>= 1.5), else 0: the
  operator then reconciles nothing (kuberay_support.py).
- `kuberl_operator_leader`: 1 on the replica that reconciles (the Lease holder, or the only replica), 0 on a standby.
- `kuberl_operator_rollout_pods{rljob_namespace, rljob, state}`: the separate rollout pool of each RLJob whose Ray
  cluster runs, state `desired` (status.rollout.replicas) or `ready` (readyReplicas); from the RLJob watch, like
  the phases (`RolloutPools`). The engines the trainer uses are its own metric, `kuberl_rollout_engines`.
- `kuberl_operator_rollout_resizes_total{direction}`: resizes (`up`, `down`) written to a running Ray cluster.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kuberl.api.status import Phase

REGISTRY = CollectorRegistry(auto_describe=True)
UNKNOWN_PHASE = "Unknown"

RECONCILE_DURATION = Histogram(
    "kuberl_operator_reconcile_duration_seconds",
    "Time spent in one operator handler run.",
    ["handler"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "kuberl_operator_reconcile_errors",
    "Handler runs that raised an error (kopf retries temporary ones).",
    ["handler"],
    registry=REGISTRY,
)
RESTARTS = Counter(
    "kuberl_operator_restarts",
    "RayJob retries (a new Ray cluster after a failed attempt) written to RLJob status.restarts.",
    registry=REGISTRY,
)

KUBERAY_SUPPORTED = Gauge(
    "kuberl_operator_kuberay_supported",
    "1 when the installed KubeRay keeps the RayJob fields kuberl writes (KubeRay >= 1.5), 0 when it refuses to run.",
    registry=REGISTRY,
)
LEADER = Gauge(
    "kuberl_operator_leader",
    "1 on the operator replica that reconciles (holds the leader Lease), 0 on a standby.",
    registry=REGISTRY,
)


class PhaseTracker(Collector):
    """RLJob phase by object uid, fed from the RLJob watch; exported as `kuberl_operator_rljobs{phase}`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[str, str] = {}

    def observe(self, uid: str, phase: str | None) -> None:
        with self._lock:
            self._phases[uid] = phase or UNKNOWN_PHASE

    def forget(self, uid: str) -> None:
        with self._lock:
            self._phases.pop(uid, None)

    def counts(self) -> dict[str, int]:
        with self._lock:
            tally = Tally(self._phases.values())
        counts = {str(p): tally.get(str(p), 0) for p in Phase}
        if tally.get(UNKNOWN_PHASE):
            counts[UNKNOWN_PHASE] = tally[UNKNOWN_PHASE]
        return counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kuberl_operator_rljobs", "RLJobs watched by the operator, by phase.", labels=["phase"]
        )
        for phase, count in sorted(self.counts().items()):
            family.add_metric([phase], count)
        yield family


PHASES = PhaseTracker()
REGISTRY.register(PHASES)

ROLLOUT_RESIZES = Counter(
    "kuberl_operator_rollout_resizes",
    "Resizes of a running Ray cluster's rollout pool (cluster.rollout.nodes edited while the job runs).",
    ["direction"],
    registry=REGISTRY,
)


class RolloutPools(Collector):
    """status.rollout by RLJob uid, fed from the RLJob watch; exported as `kuberl_operator_rollout_pods`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, tuple[str, str, int, int]] = {}

    def observe(self, uid: str, namespace: str, name: str, pool: dict[str, int] | None) -> None:
        """`pool`: the RLJob's status.rollout; None (no running Ray cluster, no separate pool) drops its series."""
        with self._lock:
            if pool is None:
                self._pools.pop(uid, None)
            else:
                self._pools[uid] = (
                    namespace,
                    name,
                    int(pool.get("replicas") or 0),
                    int(pool.get("readyReplicas") or 0),
                )

    def forget(self, uid: str) -> None:
        self.observe(uid, "", "", None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kuberl_operator_rollout_pods",
            "Pods of an RLJob's separate rollout pool: desired (the Ray cluster's rollout group) and ready.",
            labels=["rljob_namespace", "rljob", "state"],
        )
        with self._lock:
            pools = sorted(self._pools.values())
        for namespace, name, desired, ready in pools:
            family.add_metric([namespace, name, "desired"], desired)
            family.add_metric([namespace, name, "ready"], ready)
        yield family


ROLLOUT_POOLS = RolloutPools()
REGISTRY.register(ROLLOUT_POOLS)


@contextmanager
def reconciling(handler: str) -> Iterator[None]:
    """Time a handler run and count it as an error when it raises."""
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        RECONCILE_ERRORS.labels(handler).inc()
        raise
    finally:
        RECONCILE_DURATION.labels(handler).observe(time.perf_counter() - start)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """`/metrics` on `addr:port` in a daemon thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
