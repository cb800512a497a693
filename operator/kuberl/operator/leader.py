"""Leader election through a `coordination.k8s.io/v1` Lease, with client-go's `leaderelection` semantics.

kopf's own peering only pauses lower-priority operators and freezes equal ones; a Lease gives the usual guarantee:

- a replica leads while it holds the Lease; it renews every `retry_period` seconds;
- a standby takes the Lease once it has seen the same record unchanged for `lease_duration` seconds, timed on its
  own monotonic clock (no clock skew between nodes matters);
- a leader that could not renew for `renew_deadline` seconds (< `lease_duration`) stops the process before any
  standby may take over: two replicas never reconcile at once;
- a leader that stops cleanly (SIGTERM) releases the Lease, so a rollout hands over at once.

A killed leader (kill -9, node loss) is replaced after at most `lease_duration + retry_period` seconds.
Every write carries the `resourceVersion` it read: of two standbys racing for the Lease, one gets 409 Conflict.
"""

from __future__ import annotations

import dataclasses
import datetime
import http.server
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger("kuberl.operator.leader")

MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # metav1.MicroTime as the apiserver parses it


@dataclasses.dataclass(frozen=True)
class LeaseConfig:
    """Where the Lease lives, who we are, and the three timings (seconds)."""

    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"leader election needs 0 < retry-period ({self.retry_period}) < renew-deadline "
                f"({self.renew_deadline}) < lease-duration ({self.lease_duration})"
            )


def _micro_time(at: datetime.datetime) -> str:
    return at.astimezone(datetime.UTC).strftime(MICRO_TIME)


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """What a replica reads of the Lease."""

    version: str | None
    holder: str
    duration: float | None
    acquire_time: datetime.datetime | None
    transitions: int

    @classmethod
    def of(cls, lease: client.V1Lease) -> LeaseRecord:
        spec = lease.spec or client.V1LeaseSpec()
        meta = lease.metadata or client.V1ObjectMeta()
        return cls(
            version=meta.resource_version,
            holder=spec.holder_identity or "",
            duration=spec.lease_duration_seconds,
            acquire_time=spec.acquire_time,
            transitions=spec.lease_transitions or 0,
        )


class LeaderElector:
    """Acquires and renews one Lease; `observed_*` is what this replica last saw of it and when (monotonic)."""

    def __init__(
        self, api: client.CoordinationV1Api, cfg: LeaseConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.clock = clock
        self.observed_version: str | None = None
        self.observed_at = 0.0
        self.last_renewed = 0.0

    def _body(self, *, acquire_time: str, transitions: int, version: str | None) -> Any:
        """A Lease as a dict (times as MicroTime strings), which the client sends as it is."""
        metadata: dict[str, Any] = {"name": self.cfg.name, "namespace": self.cfg.namespace}
        if version is not None:
            metadata["resourceVersion"] = version
        now = _micro_time(datetime.datetime.now(datetime.UTC))
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.cfg.identity,
                "leaseDurationSeconds": max(1, round(self.cfg.lease_duration)),
                "acquireTime": acquire_time,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        now = self.clock()
        try:
            record = LeaseRecord.of(self.api.read_namespaced_lease(self.cfg.name, self.cfg.namespace))
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading Lease %s/%s: %s %s", self.cfg.namespace, self.cfg.name, exc.status, exc.reason)
                return False
            body = self._body(
                acquire_time=_micro_time(datetime.datetime.now(datetime.UTC)), transitions=0, version=None
            )
            return self._write(lambda: self.api.create_namespaced_lease(self.cfg.namespace, body), now)
        except HTTPError as exc:
            log.warning("reading Lease %s/%s: %s", self.cfg.namespace, self.cfg.name, exc)
            return False
        if record.version != self.observed_version:
            self.observed_version, self.observed_at = record.version, now
        held_by_other = record.holder not in ("", self.cfg.identity)
        if held_by_other and self.observed_at + (record.duration or self.cfg.lease_duration) > now:
            return False
        transitions = record.transitions
        if record.holder == self.cfg.identity and record.acquire_time is not None:
            acquire_time = _micro_time(record.acquire_time)
        else:
            acquire_time, transitions = _micro_time(datetime.datetime.now(datetime.UTC)), transitions + 1
            if held_by_other:
                log.info("Lease %s held by %s expired; taking it over", self.cfg.name, record.holder)
        body = self._body(acquire_time=acquire_time, transitions=transitions, version=record.version)
        return self._write(lambda: self.api.replace_namespaced_lease(self.cfg.name, self.cfg.namespace, body), now)

    def _write(self, call: Callable[[], Any], now: float) -> bool:
        try:
            lease = call()
        except ApiException as exc:
            if exc.status != 409:  # 409: another replica wrote first
                log.warning("writing Lease %s: %s %s", self.cfg.name, exc.status, exc.reason)
            return False
        except HTTPError as exc:
            log.warning("writing Lease %s: %s", self.cfg.name, exc)
            return False
        self.observed_version, self.observed_at, self.last_renewed = LeaseRecord.of(lease).version, now, now
        return True

    def acquire(self) -> None:
        """Block until this replica leads."""
        log.info("waiting for Lease %s/%s as %s", self.cfg.namespace, self.cfg.name, self.cfg.identity)
        while not self.try_acquire_or_renew():
            time.sleep(self.cfg.retry_period)
        log.info("leading: holding Lease %s/%s as %s", self.cfg.namespace, self.cfg.name, self.cfg.identity)

    def keep_renewing(self, on_lost: Callable[[], None], stop: threading.Event) -> threading.Thread:
        """Renew every `retry_period` in a daemon thread; `on_lost()` once `renew_deadline` passes without one."""

        def loop() -> None:
            while not stop.wait(self.cfg.retry_period):
                if self.try_acquire_or_renew():
                    continue
                if self.clock() - self.last_renewed >= self.cfg.renew_deadline:
                    log.error("lost Lease %s: no renewal for %.0f s; stopping", self.cfg.name, self.cfg.renew_deadline)
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="kuberl-lease", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Give the Lease up (clean shutdown): an empty holder lets a standby take it at its next attempt."""
        try:
            record = LeaseRecord.of(self.api.read_namespaced_lease(self.cfg.name, self.cfg.namespace))
            if record.holder != self.cfg.identity:
                return
            body = self._body(
                acquire_time=_micro_time(record.acquire_time or datetime.datetime.now(datetime.UTC)),
                transitions=record.transitions,
                version=record.version,
            )
            body["spec"]["holderIdentity"] = ""
            self.api.replace_namespaced_lease(self.cfg.name, self.cfg.namespace, body)
            log.info("released Lease %s/%s", self.cfg.namespace, self.cfg.name)
        except (ApiException, HTTPError) as exc:
            log.warning("releasing Lease %s: %s (a standby takes over when it expires)", self.cfg.name, exc)


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path.split("?")[0] == "/healthz"
        body = b"standby: waiting for the leader Lease\n" if ok else b"not found\n"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class StandbyHealth:
    """/healthz (200) on the health port while a standby waits, so that its liveness probe passes; closed before
    kopf binds the same port for its own liveness endpoint."""

    def __init__(self, port: int, addr: str = "0.0.0.0") -> None:
        self.server: http.server.ThreadingHTTPServer | None = None
        if port:
            self.server = http.server.ThreadingHTTPServer((addr, port), _Healthy)
            threading.Thread(target=self.server.serve_forever, name="kuberl-standby-health", daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
