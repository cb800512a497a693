"""The names the operator and the trainer share, in one place (as KubeRay keeps its own in `utils/constant.go`).

The operator renders a RayJob with these labels, annotations, environment and entrypoint; the trainer reads them
inside that RayJob. A name that one side sets and the other never reads does not belong here (it is a bug):
`tests/api/test_contract.py` checks the rendered RayJob against this module.
"""

from __future__ import annotations

from datetime import UTC, datetime

# --- the RLJob API -------------------------------------------------------------------------------------------------

GROUP = "kuberl.io"  # API group of the RLJob custom resource
VERSION = "v1alpha1"  # the one served (and stored) version
KIND = "RLJob"  # the resource's kind
PLURAL = "rljobs"  # the resource's plural, as in the REST path and `kubectl get rljobs`
API_VERSION = f"{GROUP}/{VERSION}"  # apiVersion of an RLJob document
MAX_NAME_LENGTH = 47  # longest RLJob name: KubeRay derives names up to 63 characters from the RayJob's (its limit)

# --- KubeRay's RayJob, the child the operator creates -------------------------------------------------------------

RAY_GROUP = "ray.io"  # API group of KubeRay's resources
RAY_VERSION = "v1"  # the RayJob version the operator writes and watches
RAYJOB_KIND = "RayJob"  # the child's kind
RAYJOB_PLURAL = "rayjobs"  # the child's plural
RAYJOB_API_VERSION = f"{RAY_GROUP}/{RAY_VERSION}"  # apiVersion of the rendered RayJob

# --- labels --------------------------------------------------------------------------------------------------------

RLJOB_LABEL = f"{GROUP}/rljob"  # on every child object: the owning RLJob's name (the operator watches RayJobs by it)
POOL_LABEL = f"{GROUP}/pool"  # pod label and Ray node label of every Ray pod: its pool; the trainer selects by it
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's queue label, copied from cluster.queueName onto the RayJob

# --- pools (values of POOL_LABEL) ----------------------------------------------------------------------------------

HEAD_POOL = "head"  # the Ray head pod: runs the driver (the single controller), no actors
TRAINER_POOL = "trainer"  # the worker group of cluster.trainer: FSDP ranks (and colocated rollout engines)
ROLLOUT_POOL = "rollout"  # the worker group of cluster.rollout: rollout engines when rollout.placement is separate

# --- annotations ---------------------------------------------------------------------------------------------------

SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"  # on the ConfigMap and the RayJob: hash of the spec they were built from

# --- the spec file -------------------------------------------------------------------------------------------------

SPEC_DIR = "/etc/kuberl"  # where every Ray pod mounts the `<name>-spec` ConfigMap, read-only
SPEC_FILE = "spec.json"  # the ConfigMap key holding the spec (camelCase JSON, defaults filled in)
SPEC_PATH = f"{SPEC_DIR}/{SPEC_FILE}"  # the file the trainer reads

# --- checkpoint storage --------------------------------------------------------------------------------------------

CHECKPOINT_MOUNT = "/var/lib/kuberl/checkpoints"  # where the storage claim is mounted on the head and every worker;
# a relative trainer.checkpointDir is resolved under it in the spec the pods read
DRIVER_LOG = "logs/driver.log"  # under trainer.checkpointDir (the pods' view): the driver appends all it prints
# there, each attempt after a header line, so that `kuberl logs` reads it after the head pod or the cluster is gone

# --- environment of the Ray head pod (the driver runs there) -------------------------------------------------------

ENV_REPORT_STATUS = "KUBERL_REPORT_STATUS"  # "1": the driver patches rljobs/status.progress (StatusReporter)
ENV_RLJOB_NAMESPACE = "KUBERL_RLJOB_NAMESPACE"  # the RLJob's namespace: the default of the trainer's --namespace
ENV_RLJOB_UID = "KUBERL_RLJOB_UID"  # the RLJob's uid: recorded in checkpoints (another job's are not resumed) and
# the involvedObject of the Events the trainer posts

# --- Ray token authentication (Ray >= 2.52, KubeRay >= 1.5.1) ------------------------------------------------------
# The rendered RayJob asks KubeRay for it (`rayClusterSpec.authOptions.mode: token`). KubeRay then creates a Secret
# per Ray cluster (named like the RayCluster, `status.rayClusterName` of the RayJob; owned by it), sets both
# variables in every Ray container and the submitter, and sends the token on its own dashboard calls.

RAY_AUTH_MODE_TOKEN = "token"  # authOptions.mode of the rendered RayJob, and the value KubeRay gives ENV_RAY_AUTH_MODE
ENV_RAY_AUTH_MODE = "RAY_AUTH_MODE"  # "token": Ray refuses unauthenticated calls
ENV_RAY_AUTH_TOKEN = "RAY_AUTH_TOKEN"  # the token, from KubeRay's Secret; ray.init and `ray job submit` read it
RAY_AUTH_ENV = (ENV_RAY_AUTH_MODE, ENV_RAY_AUTH_TOKEN)  # KubeRay's to set: the operator drops them from cluster.env
TOKEN_SECRET_KEY = "auth_token"  # key of the token in KubeRay's Secret


# --- the entrypoint ------------------------------------------------------------------------------------------------

TRAINER_MODULE = "kuberl.trainer.run"  # `python -m` this: the RayJob's entrypoint, the driver of the RL loop


def entrypoint(name: str, namespace: str) -> str:
    """The RayJob's entrypoint: the trainer on the mounted spec, reporting to RLJob `namespace/name`."""
    return f"python -m {TRAINER_MODULE} --spec-file {SPEC_PATH} --name {name} --namespace {namespace}"


# --- the Ray pods' preStop hooks (kuberl.trainer.prestop) ---------------------------------------------------------

PRESTOP_MODULE = "kuberl.trainer.prestop"
DASHBOARD_PORT = 8265  # the Ray dashboard's port on the head (KubeRay's default, which the operator renders)
HEAD_DASHBOARD = f"http://127.0.0.1:{DASHBOARD_PORT}"  # the head's own dashboard, where the hook stops jobs
RAY_JOB_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"  # Ray's job supervisor SIGKILLs a stopped driver after this (3 s)


def prestop_command(role: str, grace_seconds: int) -> list[str]:
    """The preStop exec of a Ray container (`role`: head or worker), bounded by the pod's grace period."""
    command = ["python", "-m", PRESTOP_MODULE, role, "--timeout", str(grace_seconds)]
    return [*command, "--dashboard", HEAD_DASHBOARD] if role == "head" else command


# --- exit codes of the trainer (the RayJob's entrypoint) ------------------------------------------------------------

EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, checkpoint saved
EXIT_STOPPED = 143  # 128 + SIGTERM: stopped by Kubernetes or Ray (suspend, preemption, drain), checkpoint saved
EXIT_PERMANENT = 3  # a failure a retry cannot fix (data, model, file, reward function, spec): the trainer reported
# it in status.progress.failure and the operator ends the RLJob Failed without a retry (any other code: transient)

# --- status --------------------------------------------------------------------------------------------------------

PROGRESS_FIELD = (
    "progress"  # the status field the trainer owns (kuberl.api.status.Progress); the operator never writes it
)
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # RFC 3339 in UTC, seconds: every time the operator or the trainer writes


def timestamp(at: datetime | None = None) -> str:
    """`at` (default: now) in TIMESTAMP_FORMAT."""
    return (at or datetime.now(UTC)).astimezone(UTC).strftime(TIMESTAMP_FORMAT)


# --- sandbox pools (kuberl.sandbox; the operator renders them, the trainer calls them) -----------------------------

SANDBOX_MODULE = "kuberl.sandbox"  # `python -m` this: the execution server, pid 1 of every sandbox pod
SANDBOX_PORT = 8000  # the server's HTTP port, and the Service's
SANDBOX_WORKROOT = "/tmp"  # the memory-backed volume of a sandbox pod where its executions' directories live
SANDBOX_REWARD = "reward"  # the pool of reward.sandbox
SANDBOX_TOOLS = "tools"  # the pool of rollout.agent.sandbox
SANDBOX_LABEL = f"{GROUP}/sandbox"  # on a sandbox pod, instead of RLJOB_LABEL: the owning RLJob's name. Not
# RLJOB_LABEL, so that the Ray NetworkPolicy neither selects the pool nor admits it as one of the job's pods


def sandbox_name(name: str, role: str) -> str:
    """The Deployment and Service of RLJob `name`'s pool `role` (SANDBOX_REWARD, SANDBOX_TOOLS)."""
    return f"{name}-sandbox-{role}"


def sandbox_url(name: str, namespace: str, role: str) -> str:
    """Where the trainer reaches the pool: its Service."""
    return f"http://{sandbox_name(name, role)}.{namespace}.svc:{SANDBOX_PORT}"


def sandbox_command(executions_per_pod: int, limits_json: str) -> list[str]:
    """The sandbox container's command; `limits_json` is the spec's `sandbox.execution` in its wire form."""
    return [
        "python",
        "-m",
        SANDBOX_MODULE,
        "serve",
        "--listen",
        f"0.0.0.0:{SANDBOX_PORT}",
        "--executions",
        str(executions_per_pod),
        "--limits",
        limits_json,
        "--workroot",
        SANDBOX_WORKROOT,
    ]
