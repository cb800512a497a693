"""Two operator processes with `--leader-elect` against the real apiserver: one reconciles, the other waits; a
leader killed with SIGKILL is replaced within `lease_duration + retry_period` (+ the standby's watch start-up), and
no RLJob gets a second RayJob or loses the status KubeRay reported while nobody led."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from e2e.harness import Cluster
from e2e.operator.kuberay_sim import KubeRaySim
from e2e.operator.manifests import rljob
from e2e.operator.process import OperatorProcess
from e2e.operator.test_operator import Kube, wait_until

LEASE = "kuberl-leader"
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6.0, 4.0, 1.0
# the standby notices the expiry within LEASE_DURATION + RETRY_PERIOD; kopf then lists and watches (~2 s here)
TAKEOVER_BOUND = LEASE_DURATION + RETRY_PERIOD + 5.0


@pytest.fixture(autouse=True)
def _needs_rljob_crd(rljob_crd: dict) -> None:
    """Every test here needs the RLJob CRD (see conftest.rljob_crd)."""


@pytest.fixture
def k(kube: client.ApiClient, namespace: str) -> Kube:
    return Kube(kube, namespace)


@pytest.fixture
def replicas(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[dict[str, OperatorProcess]]:
    """Replicas `op-a` (started first, so it leads) and `op-b`, electing through a Lease in the test namespace."""

    def replica(identity: str) -> OperatorProcess:
        return OperatorProcess(
            kubeconfig=cluster.kubeconfig,
            log_dir=tmp_path / identity,
            namespaces=(namespace,),
            extra_args=(
                "--resync-seconds=2",
                "--leader-elect",
                f"--lease-name={LEASE}",
                f"--lease-namespace={namespace}",
                f"--identity={identity}",
                f"--lease-duration={LEASE_DURATION}",
                f"--renew-deadline={RENEW_DEADLINE}",
                f"--retry-period={RETRY_PERIOD}",
            ),
        )

    procs = {"op-a": replica("op-a"), "op-b": replica("op-b")}
    try:
        procs["op-a"].start()
        wait_until("op-a holds the Lease", lambda: holder(cluster, namespace) == "op-a")
        procs["op-b"].start()  # healthy while it waits: the standby serves /healthz
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()
            print(proc.logs()[-8000:])


def holder(cluster: Cluster, namespace: str) -> str | None:
    api = client.CoordinationV1Api(cluster.api_client())
    try:
        return api.read_namespaced_lease(LEASE, namespace).spec.holder_identity or None
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def leader_gauge(proc: OperatorProcess) -> float:
    (line,) = [x for x in proc.metrics().splitlines() if x.startswith("kuberl_operator_leader ")]
    return float(line.split()[1])


def test_only_the_lease_holder_reconciles(replicas: dict[str, OperatorProcess], k: Kube, sim: KubeRaySim) -> None:
    assert leader_gauge(replicas["op-a"]) == 1 and leader_gauge(replicas["op-b"]) == 0
    assert "standby" in replicas["op-b"].healthz()
    k.create_rljob(rljob("one"))
    wait_until("RayJob", lambda: k.rayjob("one"))
    sim.initializing(k.ns, "one")
    sim.running(k.ns, "one")
    k.wait_phase("one", "Running")
    assert "one" not in replicas["op-b"].logs()  # the standby never looked at it
    assert len(k.rayjobs("kuberl.io/rljob=one")) == 1


def test_a_killed_leader_is_replaced_in_time_without_duplicates_or_lost_status(
    cluster: Cluster, replicas: dict[str, OperatorProcess], k: Kube, sim: KubeRaySim
) -> None:
    k.create_rljob(rljob("before"))
    wait_until("RayJob of before", lambda: k.rayjob("before"))
    sim.initializing(k.ns, "before")
    sim.running(k.ns, "before")
    k.wait_phase("before", "Running")

    replicas["op-a"].kill()  # SIGKILL: no release, the Lease must run out
    killed_at = time.monotonic()
    # while nobody leads: KubeRay finishes one job and a user creates another
    sim.complete(k.ns, "before")
    k.create_rljob(rljob("during"))

    wait_until("op-b takes the Lease", lambda: holder(cluster, k.ns) == "op-b", timeout=TAKEOVER_BOUND + 10)
    took_over = time.monotonic() - killed_at
    wait_until("RayJob of during", lambda: k.rayjob("during"), timeout=TAKEOVER_BOUND + 10)
    reconciled = time.monotonic() - killed_at
    print(f"takeover after SIGKILL: Lease {took_over:.1f} s, first reconcile {reconciled:.1f} s")
    assert took_over <= LEASE_DURATION + RETRY_PERIOD + 1.0
    assert reconciled <= TAKEOVER_BOUND
    assert leader_gauge(replicas["op-b"]) == 1

    assert k.wait_phase("before", "Succeeded")["status"]["phase"] == "Succeeded"  # status reported while no leader
    time.sleep(3)  # a few resyncs of the new leader: still exactly one child each
    for name in ("before", "during"):
        assert len(k.rayjobs(f"kuberl.io/rljob={name}")) == 1, name


def test_a_leader_stopped_cleanly_hands_over_at_once(
    cluster: Cluster, replicas: dict[str, OperatorProcess], k: Kube
) -> None:
    stopped_at = time.monotonic()
    assert replicas["op-a"].stop() == 0
    wait_until("op-b takes the Lease", lambda: holder(cluster, k.ns) == "op-b", timeout=LEASE_DURATION)
    handed_over = time.monotonic() - stopped_at
    print(f"handover after SIGTERM: {handed_over:.1f} s")
    assert handed_over < LEASE_DURATION  # released, not expired
    k.create_rljob(rljob("after"))
    wait_until("RayJob of after", lambda: k.rayjob("after"))


def test_a_leader_that_cannot_renew_stops_before_its_lease_runs_out(
    cluster: Cluster, replicas: dict[str, OperatorProcess], k: Kube
) -> None:
    """Another holder overwrites the Lease (as after a partition): op-a's renewals fail and it exits."""
    api = client.CoordinationV1Api(cluster.api_client())
    replicas["op-b"].stop()
    lease = api.read_namespaced_lease(LEASE, k.ns)
    lease.spec.holder_identity = "intruder"
    api.replace_namespaced_lease(LEASE, k.ns, lease)
    taken_at = time.monotonic()
    wait_until("op-a exits", lambda: not replicas["op-a"].alive(), timeout=RENEW_DEADLINE + 5)
    assert time.monotonic() - taken_at < LEASE_DURATION
    assert replicas["op-a"].popen is not None and replicas["op-a"].popen.returncode == 1
    assert "lost Lease" in replicas["op-a"].logs()
