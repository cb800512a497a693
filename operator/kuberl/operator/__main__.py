"""`python -m kuberl.operator [--namespace NS ... | --all-namespaces] [--leader-elect] [--metrics-port 8080] [--health-port 8081]`

Without `--leader-elect`, exactly ONE replica may run per watched namespace set (a Deployment with `replicas: 1`
and `strategy: Recreate`). With it, any number may run: each waits for the Lease `--lease-name` in its own
namespace (`$POD_NAMESPACE`) and only the holder runs kopf (leader.py). Liveness on
`http://0.0.0.0:<health-port>/healthz` (a waiting standby answers too), Prometheus metrics on
`http://0.0.0.0:<metrics-port>/metrics` (`kuberl_operator_leader` is 1 on the replica that reconciles).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading

import kopf
from kubernetes import client

from kuberl.api.policy import add_policy_arguments, policy_from_arguments
from kuberl.operator import metrics
from kuberl.operator.leader import LeaderElector, LeaseConfig, StandbyHealth
from kuberl.operator.settings import OperatorConfig


def parse_args(argv: list[str] | None = None) -> OperatorConfig:
    parser = argparse.ArgumentParser(prog="python -m kuberl.operator", description=__doc__.split("\n\n")[1])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable); default: $KUBERL_NAMESPACES (comma-separated)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch RLJobs in every namespace")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0 disables)")
    parser.add_argument("--health-port", type=int, default=8081, help="liveness /healthz port (0 disables)")
    parser.add_argument("--max-workers", type=int, default=16, help="concurrent synchronous handlers")
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=300.0,
        help="recompute every live RLJob's status this often (0 disables)",
    )
    parser.add_argument(
        "--diagnose-seconds",
        type=float,
        default=3.0,
        help="look this often at why waiting RLJobs' Ray clusters are not running (0 disables)",
    )
    parser.add_argument(
        "--progress-timeout-seconds",
        type=float,
        default=900.0,
        help="warn (an Event) when a Running RLJob's trainer has not reported progress for this long (0 disables)",
    )
    add_policy_arguments(parser)
    election = parser.add_argument_group("leader election (several replicas)")
    election.add_argument("--leader-elect", action="store_true", help="reconcile only while holding the Lease")
    election.add_argument("--lease-name", default="kuberl-leader", help="name of the Lease")
    election.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE", ""), help="namespace of the Lease ($POD_NAMESPACE)"
    )
    election.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        help="this replica's name in the Lease ($POD_NAME, else host-pid)",
    )
    election.add_argument("--lease-duration", type=float, default=15.0, help="seconds a lease holds unrenewed")
    election.add_argument("--renew-deadline", type=float, default=10.0, help="seconds the leader may fail to renew")
    election.add_argument("--retry-period", type=float, default=2.0, help="seconds between acquire/renew attempts")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    namespaces = [n for ns in args.namespace for n in ns.split(",") if n]
    if not namespaces and not args.all_namespaces:
        namespaces = [n for n in os.environ.get("KUBERL_NAMESPACES", "").split(",") if n]
    if not namespaces and not args.all_namespaces:
        parser.error("give --namespace NS (repeatable) or --all-namespaces")
    lease = None
    if args.leader_elect:
        if not args.lease_namespace:
            parser.error("--leader-elect needs --lease-namespace (or $POD_NAMESPACE)")
        try:
            lease = LeaseConfig(
                name=args.lease_name,
                namespace=args.lease_namespace,
                identity=args.identity,
                lease_duration=args.lease_duration,
                renew_deadline=args.renew_deadline,
                retry_period=args.retry_period,
            )
        except ValueError as exc:
            parser.error(str(exc))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return OperatorConfig(
        namespaces=tuple(namespaces),
        all_namespaces=args.all_namespaces,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        max_workers=args.max_workers,
        resync_seconds=args.resync_seconds,
        diagnose_seconds=args.diagnose_seconds,
        progress_timeout_seconds=args.progress_timeout_seconds,
        trust=policy_from_arguments(args),
        lease=lease,
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    import kuberl.operator.handlers  # noqa: F401 (registers the handlers)

    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port)
    elector = None
    if cfg.lease is not None:
        from kuberl.operator.handlers import kube_client

        elector = LeaderElector(client.CoordinationV1Api(kube_client(1)), cfg.lease)
        standby = StandbyHealth(cfg.health_port)
        try:
            elector.acquire()
        finally:
            standby.close()
        # a leader that cannot renew stops at once: a standby may take the Lease after lease_duration
        elector.keep_renewing(on_lost=lambda: os._exit(1), stop=threading.Event())
    metrics.LEADER.set(1)
    liveness = f"http://0.0.0.0:{cfg.health_port}/healthz" if cfg.health_port else None
    kopf.run(
        standalone=True,
        clusterwide=cfg.all_namespaces,
        namespaces=() if cfg.all_namespaces else cfg.namespaces,
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=cfg),
    )
    if elector is not None:
        elector.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
