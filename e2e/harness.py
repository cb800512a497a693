"""A real Kubernetes control plane for tests: etcd + kube-apiserver (+ kube-controller-manager), on loopback.

    from e2e.harness import Cluster
    with Cluster() as cluster:              # binaries from `bash e2e/tools.sh install`
        cluster.kubectl("get", "crds")
        cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", ...}, namespace="default")

Start-up: ~5 s to /readyz, 10-20 s until KubeRay's 2.3 MB of CRDs are Established (2 busy cores).
Or, for a shell: `python -m e2e.harness up` prints a KUBECONFIG to export and runs until Ctrl-C or SIGTERM.

What runs: etcd (no fsync, data in a temp dir), kube-apiserver with `--authorization-mode=RBAC`, its own CA and
serving cert, client-cert users `admin` (group system:masters) and `limited` (authenticated, no bindings), an ES256
service-account signing key. KubeRay's CRDs (all of them, from the ray-operator Go module that `e2e/tools.sh` caches)
and kuberl's `crds/rljob.yaml` (when present) are installed and Established before kube-controller-manager starts,
so that its garbage collector knows their resources from its first second; a CRD the apiserver refuses is recorded in
`crd_errors`, not raised, so that the tests that need it can report the apiserver's message. kube-controller-manager
runs the garbage collector, namespace, service-account, root-CA publisher, ClusterRole aggregation, Job and
ResourceQuota controllers. No scheduler, no kubelet: pods stay Pending.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e import pki

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # KubeRay's CRDs: 0.8 s instead of 3.4 s

REPO_ROOT = Path(__file__).resolve().parent.parent
VERSIONS_FILE = REPO_ROOT / "e2e" / "tools" / "versions.env"
INSTALL_HINT = "bash e2e/tools.sh install"

K8S_TOOLS = ("kube-apiserver", "kube-controller-manager", "kubectl", "etcd")
ALL_TOOLS = (*K8S_TOOLS, "helm", "ray-operator")

# kube-controller-manager's controllers that need neither nodes nor a cloud: GC of owned objects, namespace
# deletion, the `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap in every namespace, the
# aggregation that fills the `view`/`edit`/`admin` ClusterRoles (also from `aggregate-to-*` labelled roles), Jobs,
# and ResourceQuota usage.
CONTROLLERS = (
    "clusterrole-aggregation-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "job-controller",  # KubeRay's submitter is a batch/v1 Job
    "resourcequota-controller",  # quota admission refuses pods until this fills the ResourceQuota's status
)


class ToolMissing(RuntimeError):
    """A binary the harness needs is not built; the message says how to get it."""


class ClusterError(RuntimeError):
    """A component did not start or a CRD did not become Established; the message carries its log tail."""


class CommandError(subprocess.CalledProcessError):
    """A kubectl or helm call failed; unlike CalledProcessError, the message carries its stderr."""

    def __str__(self) -> str:
        tool = Path(self.cmd[0]).name
        return f"{tool} {' '.join(self.cmd[1:])} exited {self.returncode}: {(self.stderr or '').strip()}"


KubectlError = CommandError


def kuberay_crd_files() -> list[Path]:
    """Every CRD of the supported KubeRay module version, as `e2e/tools.sh install` cached them."""
    return sorted(Tools.from_env().kuberay_crd_dir().glob("*.yaml"))


def rljob_crd_file() -> Path:
    """kuberl's generated CRD; `KUBERL_RLJOB_CRD` points at another file (to try a change without regenerating)."""
    return Path(os.environ.get("KUBERL_RLJOB_CRD", REPO_ROOT / "crds" / "rljob.yaml"))


def _read_versions() -> dict[str, str]:
    pairs = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pairs[key.strip()] = value.strip()
    return pairs


@dataclass(frozen=True)
class Tools:
    """Where `e2e/tools.sh install` puts the binaries; `KUBERL_<TOOL>` (e.g. KUBERL_KUBECTL) overrides one."""

    root: Path
    k8s_version: str
    helm_version: str
    kuberay_version: str

    @classmethod
    def from_env(cls) -> Tools:
        versions = _read_versions()
        root = Path(os.environ.get("KUBERL_TOOLS_DIR", Path.home() / ".cache" / "kuberl" / "tools")).expanduser()
        return cls(
            root=root,
            k8s_version=versions["K8S_VERSION"],
            helm_version=versions["HELM_VERSION"],
            kuberay_version=versions["KUBERAY_VERSION"],
        )

    def kuberay_dir(self) -> Path:
        return self.root / f"kuberay-{self.kuberay_version}"

    def kuberay_crd_dir(self) -> Path:
        """KubeRay's CRDs from the ray-operator module (`KUBERL_KUBERAY_CRDS` points at another folder)."""
        return Path(os.environ.get("KUBERL_KUBERAY_CRDS", self.kuberay_dir() / "crds"))

    def kuberay_role(self) -> Path:
        """The ClusterRole KubeRay's own manifests (config/rbac/role.yaml) grant its controller."""
        return self.kuberay_dir() / "rbac" / "role.yaml"

    def path(self, name: str) -> Path:
        override = os.environ.get("KUBERL_" + name.replace("-", "_").upper())
        if override:
            return Path(override)
        if name == "helm":
            return self.root / f"helm-{self.helm_version}" / "helm"
        if name in K8S_TOOLS:
            return self.root / f"kubernetes-{self.k8s_version}" / name
        if name == "ray-operator":
            return self.kuberay_dir() / name
        raise KeyError(name)

    def missing(self, names: Iterable[str] = ALL_TOOLS) -> list[str]:
        return [n for n in names if not os.access(self.path(n), os.X_OK)]

    def require(self, names: Iterable[str]) -> None:
        missing = self.missing(names)
        if missing:
            raise ToolMissing(f"{', '.join(missing)} not built under {self.root}: run `{INSTALL_HINT}`")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the test process dies, so that no server outlives a crash."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Cluster:
    """etcd + kube-apiserver (+ kube-controller-manager) on 127.0.0.1 ports picked at start."""

    tools: Tools = field(default_factory=Tools.from_env)
    controller_manager: bool = True
    install_crds: bool = True
    kuberay_crds: bool = True
    extra_crds: tuple[Path, ...] = ()
    workdir: Path | None = None
    start_timeout: float = 60.0

    server: str = field(init=False, default="")
    kubeconfig: Path = field(init=False, default=Path())
    limited_kubeconfig: Path = field(init=False, default=Path())
    ca_file: Path = field(init=False, default=Path())
    crd_errors: dict[Path, str] = field(init=False, default_factory=dict)
    timings: dict[str, float] = field(init=False, default_factory=dict)
    _procs: list[_Proc] = field(init=False, default_factory=list)
    _own_workdir: bool = field(init=False, default=False)
    _admin: pki.KeyPair | None = field(init=False, default=None)

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> Cluster:
        needed = [t for t in K8S_TOOLS if t != "kube-controller-manager" or self.controller_manager]
        self.tools.require(needed)
        t0 = time.monotonic()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="kuberl-e2e-"))
            self._own_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._write_pki()
            self._start_etcd()
            self.timings["etcd_s"] = time.monotonic() - t0
            self._start_apiserver()
            self.timings["apiserver_ready_s"] = time.monotonic() - t0
            self._write_kubeconfigs()
            if self.install_crds:
                self._install_crds()
            # After the CRDs: the garbage collector reads API discovery once at start and then only every 30 s, so
            # started earlier it would ignore objects owned by an RLJob (or a RayJob) for that long.
            if self.controller_manager:
                self._start_controller_manager()
            self.timings["ready_s"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill the components (controller-manager and apiserver before etcd) and remove the work dir."""
        for proc in reversed(self._procs):
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
                try:
                    proc.popen.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()
        self._procs.clear()
        if self._own_workdir and self.workdir is not None:
            if os.environ.get("KUBERL_E2E_KEEP"):
                print(f"KUBERL_E2E_KEEP: logs and kubeconfigs kept in {self.workdir}", file=sys.stderr)
                return
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
            self._own_workdir = False

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> dict[str, bool]:
        return {p.name: p.popen.poll() is None for p in self._procs}

    def log(self, component: str, lines: int = 50) -> str:
        """The last lines a component (etcd, kube-apiserver, kube-controller-manager) wrote."""
        return next(p.tail(lines) for p in self._procs if p.name == component)

    # ---- clients ---------------------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG set to the admin kubeconfig and the tool dirs first on PATH."""
        dirs = {str(self.tools.path(t).parent) for t in ("kubectl", "helm")}
        path = os.pathsep.join([*sorted(dirs), os.environ.get("PATH", "")])
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl as admin (or with `kubeconfig`, e.g. `cluster.limited_kubeconfig`); text output."""
        cmd = [str(self.tools.path("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, cmd, result.stdout, result.stderr)
        return result

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        self.tools.require(["helm"])
        cmd = [str(self.tools.path("helm")), f"--kubeconfig={self.kubeconfig}", *args]
        env = {
            **self.env,
            "HELM_CACHE_HOME": str(self.workdir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.workdir / "helm" / "data"),
        }
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if check and result.returncode != 0:
            raise CommandError(result.returncode, cmd, result.stdout, result.stderr)
        return result

    def apply(
        self,
        doc_or_path: Mapping[str, Any] | Iterable[Mapping[str, Any]] | str | Path,
        *args: str,
        namespace: str | None = None,
        server_side: bool = False,
        dry_run: str | None = None,
        validate: str = "strict",
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl apply` a manifest file, a document or a list of documents.

        `validate="strict"` is server-side field validation: unknown or duplicate fields are errors, not pruned.
        `dry_run="server"` runs admission (schema, CEL, defaulting) without persisting.
        """
        return self._manifest_verb(
            "apply", doc_or_path, args, namespace, server_side, dry_run, validate, check, kubeconfig
        )

    def create(
        self,
        doc_or_path: Mapping[str, Any] | Iterable[Mapping[str, Any]] | str | Path,
        *args: str,
        namespace: str | None = None,
        dry_run: str | None = None,
        validate: str = "strict",
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl create -f`: a POST, no last-applied annotation (what a controller does)."""
        return self._manifest_verb("create", doc_or_path, args, namespace, False, dry_run, validate, check, kubeconfig)

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        ns = ["-n", namespace] if namespace else []
        return json.loads(self.kubectl("get", resource, name, *ns, "-o", "json").stdout)

    def service_account_kubeconfig(
        self, namespace: str, name: str, duration: str = "2h", bound_pod: str | None = None
    ) -> Path:
        """A kubeconfig that authenticates as ServiceAccount `namespace/name` (a TokenRequest token), to run a
        component, e.g. the operator, with exactly the RBAC a chart grants it. With `bound_pod` the token is bound
        to that pod, as the projected token of a pod's containers is (and carries the pod's name)."""
        bound = ["--bound-object-kind=Pod", f"--bound-object-name={bound_pod}"] if bound_pod else []
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}", *bound).stdout.strip()
        path = self.workdir / f"sa-{namespace}-{name}{'-' + bound_pod if bound_pod else ''}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{name}"
        return self._write_kubeconfig(path, user, {"token": token}, namespace)

    def api_client(self, kubeconfig: Path | None = None):
        """A `kubernetes.client.ApiClient` for this cluster (needs the `kubernetes` package)."""
        from kubernetes import config as k8s_config

        return k8s_config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def wait_established(self, crd_names: Iterable[str], timeout: float = 60) -> None:
        """Wait until every named CRD has condition Established=True (its resources are then served).

        Polls API discovery (a few hundred bytes) rather than the CRD (1.4 MB for KubeRay's, whose repeated
        encoding would slow the apiserver that is compiling it), then checks the condition once.
        """
        deadline = time.monotonic() + timeout
        for name in crd_names:
            crd = self._get_json(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
            version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served"))
            while True:
                status, body = self.request("GET", f"/apis/{group}/{version}")
                if status == 200 and any(r["name"] == plural for r in json.loads(body).get("resources", [])):
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {name} not served after {timeout:.0f} s")
                time.sleep(0.05)
            while not _condition_true(
                self._get_json(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"), "Established"
            ):
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {name} not Established after {timeout:.0f} s")
                time.sleep(0.2)

    def _get_json(self, path: str) -> dict[str, Any]:
        status, body = self.request("GET", path)
        if status != 200:
            raise ClusterError(f"GET {path}: {status} {body[:500]!r}")
        return json.loads(body)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """One HTTPS request as admin, without a client library: (status, body)."""
        with self.connection() as send:
            return send(method, path, body)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Callable[[str, str, Any], tuple[int, bytes]]]:
        """:meth:`request` over one kept-alive HTTPS connection: a batch of requests pays one TLS handshake."""
        conn = http.client.HTTPSConnection("127.0.0.1", self._port, context=self._admin_ssl, timeout=30)

        def send(method: str, path: str, body: Any = None) -> tuple[int, bytes]:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()

        try:
            yield send
        finally:
            conn.close()

    # ---- internals -------------------------------------------------------------------------------------

    def _manifest_verb(self, verb, doc_or_path, args, namespace, server_side, dry_run, validate, check, kubeconfig):
        cmd = [verb, f"--validate={validate}"]
        if server_side:
            cmd.append("--server-side")
        if dry_run:
            cmd.append(f"--dry-run={dry_run}")
        if namespace:
            cmd += ["-n", namespace]
        text = None
        if isinstance(doc_or_path, (str, Path)):
            cmd += ["-f", str(doc_or_path)]
        else:
            docs = [doc_or_path] if isinstance(doc_or_path, Mapping) else list(doc_or_path)
            text = yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False)
            cmd += ["-f", "-"]
        return self.kubectl(*cmd, *args, input=text, check=check, kubeconfig=kubeconfig)

    def _write_pki(self) -> None:
        pki_dir = self.workdir / "pki"
        pki_dir.mkdir()
        ca = pki.CertificateAuthority(pki_dir)
        self.ca_file = ca.cert
        self._serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server_hosts=(
                "127.0.0.1",
                "localhost",
                "10.0.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        self._admin = ca.issue("admin", "admin", organizations=("system:masters",))
        self._limited = ca.issue("limited", "limited")
        self._kcm = ca.issue("kcm", "kuberl-e2e:controller-manager", organizations=("system:masters",))
        self._sa = pki.write_signing_key(pki_dir)

    def _spawn(self, name: str, argv: list[str]) -> _Proc:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as handle:  # the child holds its own descriptor
            popen = subprocess.Popen(
                argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
        proc = _Proc(name, popen, log)
        self._procs.append(proc)
        return proc

    def _wait(self, proc: _Proc, probe, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ClusterError(f"{proc.name} exited with {proc.popen.returncode} before {what}:\n{proc.tail()}")
            if probe():
                return
            time.sleep(0.1)
        raise ClusterError(f"{proc.name} not {what} after {self.start_timeout:.0f} s:\n{proc.tail()}")

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self._etcd_url = f"http://127.0.0.1:{client}"
        proc = self._spawn(
            "etcd",
            [
                str(self.tools.path("etcd")),
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # a test cluster's data is thrown away; fsync dominates write latency
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", client, timeout=1)
                conn.request("GET", "/health")
                body = conn.getresponse().read()
                return b'"health":"true"' in body
            except OSError:
                return False

        self._wait(proc, healthy, "healthy")

    def _start_apiserver(self) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self._apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.tools.path("kube-apiserver")),
                f"--etcd-servers={self._etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'pki'}",
                f"--tls-cert-file={self._serving.cert}",
                f"--tls-private-key-file={self._serving.key}",
                f"--client-ca-file={self.ca_file}",
                "--authorization-mode=RBAC",
                # the defaults plus nothing: NamespaceLifecycle, ServiceAccount, LimitRanger, ResourceQuota,
                # ValidatingAdmissionPolicy, webhooks, ... all run without extra infrastructure
                f"--service-account-key-file={self._sa.cert}",
                f"--service-account-signing-key-file={self._sa.key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",  # the `kubernetes` Endpoints may not point at loopback; no pods use it
                "--enable-priority-and-fairness=false",  # no request queuing in a single-client test cluster
                "--profiling=false",
                "--shutdown-delay-duration=0s",
                "--shutdown-watch-termination-grace-period=0s",
                "--v=1",
            ],
        )
        self._port = port
        self._admin_ssl = ssl.create_default_context(cafile=str(self.ca_file))
        self._admin_ssl.load_cert_chain(str(self._admin.cert), str(self._admin.key))

        def ready() -> bool:
            try:
                return self.request("GET", "/readyz")[0] == 200
            except (OSError, ssl.SSLError):
                return False

        self._wait(self._apiserver, ready, "ready (/readyz)")

    def _write_kubeconfig(self, path: Path, user: str, credentials: dict[str, str], namespace: str = "default") -> Path:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": self.server, "certificate-authority-data": _b64(self.ca_file)}}
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": user, "context": {"cluster": "e2e", "user": user, "namespace": namespace}}],
            "current-context": user,
        }
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    def _kubeconfig(self, path: Path, user: str, pair: pki.KeyPair) -> Path:
        return self._write_kubeconfig(
            path, user, {"client-certificate-data": _b64(pair.cert), "client-key-data": _b64(pair.key)}
        )

    def _write_kubeconfigs(self) -> None:
        self.kubeconfig = self._kubeconfig(self.workdir / "admin.kubeconfig", "admin", self._admin)
        self.limited_kubeconfig = self._kubeconfig(self.workdir / "limited.kubeconfig", "limited", self._limited)
        self._kcm_kubeconfig = self._kubeconfig(self.workdir / "kcm.kubeconfig", "kcm", self._kcm)

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                str(self.tools.path("kube-controller-manager")),
                f"--kubeconfig={self._kcm_kubeconfig}",
                "--leader-elect=false",
                f"--controllers={','.join(CONTROLLERS)}",
                "--secure-port=0",  # no metrics/health endpoint: nothing scrapes it
                f"--service-account-private-key-file={self._sa.key}",
                f"--root-ca-file={self.ca_file}",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )

    def _install_crds(self) -> None:
        files = [*(kuberay_crd_files() if self.kuberay_crds else []), *self.extra_crds]
        if rljob_crd_file().exists():
            files.append(rljob_crd_file())
        # One kubectl per file, all at once: the apiserver compiles the schemas concurrently.
        # `create`, not `apply`: KubeRay's CRDs are too large for apply's last-applied annotation (256 KiB), and
        # server-side apply's managed-fields bookkeeping on 1.4 MB makes it twice as slow. Strict: a typo in a
        # generated CRD (say `x-kubernetes-validation`) is an error rather than silently pruned.
        kubectl = [str(self.tools.path("kubectl")), f"--kubeconfig={self.kubeconfig}", "create", "--validate=strict"]
        running = {
            path: subprocess.Popen(
                [*kubectl, "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            for path in files
        }
        names = []
        for path, popen in running.items():
            _, stderr = popen.communicate(timeout=120)
            if popen.returncode != 0:
                self.crd_errors[path] = stderr.strip()
                continue
            names += [
                d["metadata"]["name"]
                for d in yaml.load_all(path.read_text(), Loader=_YamlLoader)
                if d and d.get("kind") == "CustomResourceDefinition"
            ]
        t0 = time.monotonic()
        self.wait_established(names)
        self.timings["crds_established_wait_s"] = time.monotonic() - t0


def main(argv: list[str]) -> int:
    """`python -m e2e.harness up`: start a cluster, print how to use it, run until interrupted."""
    if argv[1:2] != ["up"]:
        print("usage: python -m e2e.harness up", file=sys.stderr)
        return 2
    cluster = Cluster()
    try:
        cluster.start()
    except ToolMissing as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"apiserver {cluster.server} ready in {cluster.timings['ready_s']:.1f} s", flush=True)
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"limited user: {cluster.limited_kubeconfig}")
    for path, err in cluster.crd_errors.items():
        print(f"CRD {path} refused: {err}", file=sys.stderr)
    print("Ctrl-C (or SIGTERM) stops it and removes", cluster.workdir, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
