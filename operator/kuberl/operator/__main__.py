"""`python -m kuberl.operator [--namespace NS ... | --all-namespaces] [--metrics-port 8080] [--health-port 8081]`

Runs kopf standalone: no peering, no leader election, so exactly ONE replica may run per watched namespace set
(a Deployment with `replicas: 1` and `strategy: Recreate`). Liveness on `http://0.0.0.0:<health-port>/healthz`,
Prometheus metrics on `http://0.0.0.0:<metrics-port>/metrics`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import kopf

from kuberl.operator import metrics
from kuberl.operator.settings import OperatorConfig
from kuberl.operator.trust import RAY_UID, TRAINER_SERVICE_ACCOUNT, Policy


def _uid(text: str) -> int | None:
    """A uid/gid flag: a number, or "platform" to leave it to the platform (OpenShift's restricted SCC)."""
    return None if text == "platform" else int(text)


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
    security = parser.add_argument_group("security (docs/security.md; the chart's security.* values)")
    security.add_argument(
        "--trainer-service-account", default=TRAINER_SERVICE_ACCOUNT, help="service account of the Ray pods"
    )
    security.add_argument(
        "--allow-service-account",
        action="append",
        default=[],
        metavar="NAME",
        help="another service account spec.cluster.serviceAccountName may name (repeatable)",
    )
    security.add_argument(
        "--allow-volume-type",
        action="append",
        default=[],
        metavar="TYPE",
        help="a volume source beyond claims, configMaps, secrets, emptyDir, projected, ephemeral (repeatable)",
    )
    security.add_argument(
        "--pod-run-as-user", type=_uid, default=RAY_UID, help='uid/gid of the Ray pods, or "platform"'
    )
    security.add_argument("--pod-fs-group", type=_uid, default=RAY_UID, help='fsGroup of the Ray pods, or "platform"')
    security.add_argument(
        "--kuberay-namespace", default="kuberay-system", help="namespace of KubeRay's operator (NetworkPolicy)"
    )
    security.add_argument(
        "--monitoring-namespace", default=None, help="namespace allowed to scrape the Ray pods' metrics ports"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    namespaces = [n for ns in args.namespace for n in ns.split(",") if n]
    if not namespaces and not args.all_namespaces:
        namespaces = [n for n in os.environ.get("KUBERL_NAMESPACES", "").split(",") if n]
    if not namespaces and not args.all_namespaces:
        parser.error("give --namespace NS (repeatable) or --all-namespaces")
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
        trust=Policy(
            trainer_service_account=args.trainer_service_account,
            allowed_service_accounts=tuple(args.allow_service_account),
            allowed_volume_types=tuple(args.allow_volume_type),
            run_as_user=args.pod_run_as_user,
            fs_group=args.pod_fs_group,
            kuberay_namespace=args.kuberay_namespace,
            monitoring_namespace=args.monitoring_namespace,
        ),
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    import kuberl.operator.handlers  # noqa: F401 (registers the handlers)

    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port)
    liveness = f"http://0.0.0.0:{cfg.health_port}/healthz" if cfg.health_port else None
    kopf.run(
        standalone=True,
        clusterwide=cfg.all_namespaces,
        namespaces=() if cfg.all_namespaces else cfg.namespaces,
        liveness_endpoint=liveness,
        memo=kopf.Memo(config=cfg),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
