"""kopf handlers: short functions that delegate to `reconcile` (I/O) and `rayjob`/`status` (pure).

RLJob create/resume → check KubeRay's version (kuberay_support.py), validate, create-or-adopt the ConfigMap and the
                      RayJob, write status.
RLJob spec update   → propagate runPolicy.suspend (and the template while no Ray cluster exists); resize the running
                      Ray cluster's rollout group to cluster.rollout.nodes (rollout_pool.py).
RayJob event        → recompute the owning RLJob's status (phase, conditions, Events), and status.rollout.
Rollout pod event   → the rollout group's pods to remove, status.rollout and RolloutPoolEmpty (rollout_pool.py).
RLJob event with a permanent failure the trainer reported → end it Failed and delete its RayJob (no retry).
Sandbox Deployment event → status.sandboxes and SandboxReady; a finished RLJob's pools are scaled to no pods.
A thread (ownership.py) → every resync period: restore a status someone else wrote, warn about silent trainers.
RLJob event         → the `kuberl_operator_rljobs{phase}` gauge.
A thread (clusterwatch.py) → ClusterReady=False with the cause that blocks a waiting RLJob's Ray cluster.
No delete handler: the children carry controller owner references, the garbage collector removes them;
hence no finalizer, and deleting an RLJob never waits for the operator.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import kopf
from kubernetes import client, config

from kuberl.api.contract import (
    GROUP,
    PLURAL,
    POOL_LABEL,
    RAY_GROUP,
    RAY_VERSION,
    RAYJOB_PLURAL,
    RLJOB_LABEL,
    ROLLOUT_POOL,
    SANDBOX_LABEL,
    VERSION,
)
from kuberl.operator import clusterwatch, kuberay_support, metrics, ownership, reconcile
from kuberl.operator.settings import OperatorConfig, configure

log = logging.getLogger("kuberl.operator")


def kube_client(max_workers: int) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = max(4, max_workers + 4)
    configuration.retries = 3
    return client.ApiClient(configuration)


def _config(memo: Any) -> OperatorConfig:
    return memo.get("config") or OperatorConfig()


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    cfg = _config(memo)
    configure(settings, max_workers=cfg.max_workers)
    memo.api = reconcile.Api(kube_client(cfg.max_workers), trust=cfg.trust)
    memo.kuberay = kuberay_support.Gate(memo.api)
    if memo.kuberay.problem:
        log.error("not reconciling RLJobs: %s", memo.kuberay.problem)
    memo.stop = threading.Event()
    if cfg.resync_seconds > 0:
        namespaces = None if cfg.all_namespaces else list(cfg.namespaces)
        thread = threading.Thread(
            target=_resync_loop,
            args=(memo.api, namespaces, cfg.resync_seconds, cfg.progress_timeout_seconds, memo.stop),
            name="kuberl-resync",
            daemon=True,
        )
        thread.start()
    if cfg.diagnose_seconds > 0:
        threading.Thread(
            target=clusterwatch.run,
            args=(memo.api, clusterwatch.WAITING, cfg.diagnose_seconds, memo.stop),
            name="kuberl-diagnose",
            daemon=True,
        ).start()


@kopf.on.cleanup()
def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("stop") is not None:
        memo.stop.set()


def _resync_loop(
    api: reconcile.Api, namespaces: list[str] | None, every: float, progress_timeout: float, stop: threading.Event
) -> None:
    """Recompute every RLJob's status from its RayJob now and then (ownership.py): a net for a missed watch event,
    a status another identity wrote, a trainer that does not report progress."""
    post_event = clusterwatch.ClusterReads(api).post_event
    while not stop.wait(every):
        try:
            with metrics.reconciling("resync"):
                writes = ownership.resync_all(api, namespaces, progress_timeout=progress_timeout, post_event=post_event)
            if writes:
                log.info("resync corrected %d RLJob statuses", writes)
        except Exception:  # keep the loop alive; the error is counted and logged
            log.exception("resync failed")


@kopf.on.create(GROUP, VERSION, PLURAL)
def rljob_created(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    with metrics.reconciling("create"):
        memo.kuberay.require(body)
        reconcile.ensure(memo.api, body, logger)


@kopf.on.resume(GROUP, VERSION, PLURAL)
def rljob_resumed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    with metrics.reconciling("resume"):
        memo.kuberay.require(body)
        reconcile.ensure(memo.api, body, logger)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def rljob_spec_updated(body: kopf.Body, old: Any, new: Any, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    with metrics.reconciling("update"):
        reconcile.apply_update(memo.api, body, old, new, logger)


@kopf.on.event(RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, labels={RLJOB_LABEL: kopf.PRESENT})
def rayjob_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if memo.get("api") is None:
        return
    with metrics.reconciling("rayjob"):
        reconcile.on_rayjob(memo.api, dict(body), deleted=event.get("type") == "DELETED")


@kopf.on.event("", "v1", "pods", labels={POOL_LABEL: ROLLOUT_POOL, RLJOB_LABEL: kopf.PRESENT})
def rollout_pod_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A rollout pod came, became ready or went: the RayCluster's rollout group and status.rollout follow."""
    if memo.get("api") is None:
        return
    with metrics.reconciling("rollout"):
        reconcile.on_rollout_pod(memo.api, dict(body))


@kopf.on.event(GROUP, VERSION, PLURAL, when=lambda body, **_: reconcile.rollout_status_stale(body))
def rljob_rollout_stale(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The phase changed since the rollout pool was last looked at: status.rollout and RolloutPoolEmpty follow."""
    if memo.get("api") is None:
        return
    with metrics.reconciling("rollout"):
        reconcile.follow_rollout_pool(memo.api, body)


@kopf.on.event(GROUP, VERSION, PLURAL, when=lambda body, **_: reconcile.permanent_failure_unhandled(body))
def rljob_failure_reported(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The trainer reported a permanent failure: end the job now, not after KubeRay has started a retry."""
    if memo.get("api") is None:
        return
    with metrics.reconciling("failure"):
        reconcile.on_failure_reported(memo.api, body)


@kopf.on.event("apps", "v1", "deployments", labels={SANDBOX_LABEL: kopf.PRESENT})
def sandbox_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A sandbox pool's Deployment changed (its ready replicas): status.sandboxes and SandboxReady follow."""
    if memo.get("api") is None:
        return
    with metrics.reconciling("sandbox"):
        reconcile.on_sandbox_deployment(memo.api, dict(body))


@kopf.on.event(GROUP, VERSION, PLURAL, when=lambda body, **_: reconcile.sandboxes_outlive_job(body))
def rljob_finished_with_sandboxes(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A finished job's sandbox pools keep no pods."""
    if memo.get("api") is None:
        return
    with metrics.reconciling("sandbox"):
        reconcile.stop_sandboxes(memo.api, body)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def rljob_seen(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    uid = body.get("metadata", {}).get("uid")
    if not uid:
        return
    deleted = event.get("type") == "DELETED"
    clusterwatch.WAITING.observe(dict(body), deleted=deleted)
    status = body.get("status") or {}
    if deleted:
        metrics.PHASES.forget(uid)
        metrics.ROLLOUT_POOLS.forget(uid)
    else:
        metrics.PHASES.observe(uid, status.get("phase"))
        metrics.ROLLOUT_POOLS.observe(
            uid, body["metadata"]["namespace"], body["metadata"]["name"], status.get("rollout")
        )


@kopf.on.probe(id="rljobs")
def phase_counts(**_: Any) -> dict[str, int]:
    """Shown on /healthz: RLJobs by phase."""
    return metrics.PHASES.counts()
