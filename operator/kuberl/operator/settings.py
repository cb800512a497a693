"""The operator's kopf settings, in one place (docs/operator.md explains each)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any

import kopf

from kuberl.api.policy import Policy
from kuberl.operator.leader import LeaseConfig

PREFIX = "kuberl.io"


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """What `python -m kuberl.operator` parses from its command line."""

    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    metrics_port: int = 8080
    health_port: int = 8081
    max_workers: int = 16
    resync_seconds: float = 300.0
    diagnose_seconds: float = 3.0
    progress_timeout_seconds: float = 900.0  # a Running job's trainer silent this long gets an Event (0: never)
    trust: Policy = dataclasses.field(default_factory=Policy)  # the chart's security.* values
    # leader election (leader.py): None runs standalone, as the only replica
    lease: LeaseConfig | None = None


def configure(settings: kopf.OperatorSettings, *, max_workers: int = 16) -> None:
    # Events from log lines only for warnings and errors; transitions post their own Events.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "kuberl-operator"
    # Handlers are synchronous (kubernetes client); this bounds concurrent reconciles (and API connections).
    settings.execution.max_workers = max_workers
    # Retry delays of a failing handler without an explicit delay (`settings.batching` in older kopf).
    settings.queueing.error_delays = (1, 2, 5, 10, 20, 30, 60, 120, 300)
    # kopf's own bookkeeping lives in annotations, never in .status: the CRD would prune what it doesn't declare.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = BoundedDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = f"{PREFIX}/finalizer"  # unused: no handler needs one (GC via ownerReferences)
    # No kopf peering objects: with several replicas, a Lease (leader.py) decides which one runs kopf at all.
    settings.peering.standalone = True
    # Serve the namespaces given on the command line only; no list/watch of Namespaces and CRDs needed.
    settings.scanning.disabled = True
    # Reconnect watches periodically so that a silently dead connection cannot stall the operator.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60


LONG_STRING = 256  # longer strings are kept in kopf's diffbase as their hash
LONG_VALUE = 1024  # so are objects and lists below the spec's sections whose JSON is longer


class BoundedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled configuration with every long string, and every large object or list below the top two
    levels (`spec.cluster.trainer.affinity`, `spec.cluster.volumes`, a large `spec.cluster`), replaced by its
    SHA-256: the annotation stays small however large the spec is, free-form fields included, so storing it can
    never fail (422: annotations are limited to 256 KiB) and make the create handler retry forever.
    A changed value still shows as a change (its hash differs); the update handler reads the new spec from the
    object, and of the diffbase only `spec.runPolicy.suspend`, which stays a plain value."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return _bounded(super().build(body=body, extra_fields=extra_fields))


def _hash(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _bounded(value: Any, depth: int = 0) -> Any:
    """`value` with long strings hashed and, below depth 2 (the body, then `spec`), large containers hashed,
    innermost first: a large spec.cluster whose affinity is already a hash stays an object."""
    if isinstance(value, str):
        return _hash(value) if len(value) > LONG_STRING else value
    if isinstance(value, dict):
        bounded: Any = {k: _bounded(v, depth + 1) for k, v in value.items()}
    elif isinstance(value, list):
        bounded = [_bounded(v, depth + 1) for v in value]
    else:
        return value
    if depth >= 2 and len(json.dumps(bounded)) > LONG_VALUE:
        return _hash(bounded)
    return bounded
