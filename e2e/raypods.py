"""The containers of KubeRay's Ray pods, run on this machine for the stand-in kubelet, and the network between them.

    pods = LocalRayPods(api_client, "team-a", pod_root=tmp_path / "pods", pod_env={"KUBECONFIG": ...})
    with KubeRay(cluster, ("team-a",), log_dir, env=pods.proxy_env()), StandInKubelet(..., containers=pods):
        ...   # a RayJob's submitter really submits its entrypoint; KubeRay really polls the Ray job

- A head pod is a real `ray start --head` (its own short temp dir), with the environment the RayCluster's head
  template declares and the Ray token variables KubeRay adds to the pod (values, Secret and ConfigMap keys resolved
  as a kubelet would) plus `pod_env`; its ConfigMap volumes are written under `pod_root/<rljob>/mounts/<volume>`,
  each claim is the folder `pod_root/claims/<claim>`. The pod is Ready once KubeRay's readiness probe would pass
  (the dashboard agent's raylet check, the dashboard's GCS check).
- A head pod's preStop hook (`exec`) runs as a local process with the container's environment, its arguments
  rewritten as the entrypoint's are (and the dashboard's in-pod port at the head's own); `terminate` sends SIGTERM
  to `ray start`, whose processes are all killed when the kubelet gives up or deletes the pod.
- A worker pod only runs: the head's CPUs hold the whole tiny job, as in `e2e/kuberay_runner.py` (no hook runs).
- A submitter pod runs its container's command and args (KubeRay's `ray job status || ray job submit --no-wait;
  ray job logs --follow`) and ends with the command's exit code.
- Each head Service gets a local address, like a ClusterIP: a small HTTP proxy in front of the head's dashboard.
  Pods reach it by name (the submitter's `<svc>.<ns>.svc.cluster.local:8265` is resolved to it, as cluster DNS
  would); KubeRay's controller reaches it through `HTTP_PROXY` (`proxy_env()`), since its dashboard client is a
  default Go `http.Client`. Requests pass unchanged (headers, bodies, WebSocket upgrades for `--follow`), except
  one: a submitted entrypoint runs in `pod_root/<rljob>` with the mount paths pointing at the written volumes, the
  one thing a process on this machine cannot get from a mount namespace.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client

from e2e.harness import free_port
from kuberl.api.contract import DASHBOARD_PORT, RAY_AUTH_ENV

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
RLJOB_LABEL = "kuberl.io/rljob"
SERVICE_HOST = re.compile(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)")
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "transfer-encoding", "upgrade"}


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


@dataclass
class Head:
    """One Ray head process: the head pod's container."""

    pod: str
    cluster: str
    workdir: Path
    mounts: dict[str, Path]
    process: subprocess.Popen[bytes] | None = None
    dashboard_port: int = 0
    ray_dir: Path | None = None
    service: ThreadingHTTPServer | None = None
    ready: bool = False
    error: str = ""
    env: dict[str, str] = field(default_factory=dict)
    """The container's environment (what a preStop hook runs with)."""
    members: list[int] = field(default_factory=list)
    """The container's processes when its main process got SIGTERM (they die with it, as in a cgroup)."""

    def terminate(self) -> None:
        """SIGTERM to the container's main process (`ray start --block`), its processes noted for the kill."""
        if self.process is not None and self.process.poll() is None:
            self.members = process_tree(self.process.pid)
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """The container dies with everything in it: the job's driver, whose shell Ray starts in a session of its
        own, included (found before the kill, while still a descendant, or before the SIGTERM)."""
        if self.process is not None:
            alive = process_tree(self.process.pid) if self.process.poll() is None else []
            for pid in {*alive, *self.members}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait()
        if self.service is not None:
            self.service.shutdown()
            self.service.server_close()
        if self.ray_dir is not None:
            shutil.rmtree(self.ray_dir, ignore_errors=True)

    def rewrite_submission(self, body: bytes) -> bytes:
        """The entrypoint as the pod would run it: in the job's folder, the mount paths at the written volumes."""
        request = json.loads(body)
        request["entrypoint"] = f"cd {shlex.quote(str(self.workdir))} && {self.local(request['entrypoint'])}"
        return json.dumps(request).encode()

    def local(self, text: str) -> str:
        """`text` of the pod (a command) as it runs here: mount paths at the written volumes, the dashboard's
        in-pod address (KubeRay's port) at this head's port."""
        for mount_path, local in self.mounts.items():
            text = text.replace(mount_path, str(local))
        return text.replace(f"127.0.0.1:{DASHBOARD_PORT}", f"127.0.0.1:{self.dashboard_port}")


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, resolve: Any) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.resolve = resolve
        """`resolve(host) -> Head | None`: whose dashboard a request for `host` reaches."""
        self.unauthorized: list[str] = []
        """Requests the dashboard refused: 401 (no Ray token) or 403 (another cluster's token)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def serve_in_background(self) -> _Proxy:
        threading.Thread(target=self.serve_forever, name="ray-dashboard-proxy", daemon=True).start()
        return self


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards one request to a head's dashboard: absolute-form (a forward proxy) or origin-form (a ClusterIP)."""

    server: _Proxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

    def _forward(self) -> None:
        target = urlsplit(self.path)
        host = target.netloc if target.scheme else self.headers.get("Host", "")
        path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        head = self.server.resolve(host)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if head is None or not head.ready:
            self._reply(502, f"no Ray dashboard behind {host}".encode())
            return
        if self.command == "POST" and target.path.rstrip("/") == "/api/jobs":
            body = head.rewrite_submission(body)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS | {"host", "content-length"}}
        if self.headers.get("Upgrade"):
            self._tunnel(head, path, headers)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", head.dashboard_port, timeout=60)
        try:
            upstream.request(self.command, path, body=body or None, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
        except OSError as exc:
            self._reply(502, f"Ray dashboard of {head.cluster}: {exc}".encode())
            return
        finally:
            upstream.close()
        if response.status in (401, 403):
            refusal = payload[:120].decode(errors="replace")
            self.server.unauthorized.append(f"{self.command} {path}: {response.status} {refusal}")
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_HEADERS | {"content-length"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _tunnel(self, head: Head, path: str, headers: dict[str, str]) -> None:
        """A WebSocket upgrade (`ray job logs --follow`): pass the handshake on, then copy bytes both ways."""
        upstream = socket.create_connection(("127.0.0.1", head.dashboard_port))
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{head.dashboard_port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += ["Connection: Upgrade", f"Upgrade: {self.headers['Upgrade']}", "", ""]
        upstream.sendall("\r\n".join(lines).encode())
        downstream = self.connection

        def pipe(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pipe, args=(upstream, downstream), daemon=True)
        back.start()
        pipe(downstream, upstream)
        back.join()
        upstream.close()
        self.close_connection = True

    def _reply(self, status: int, text: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)


@dataclass
class LocalRayPods:
    api_client: client.ApiClient
    namespace: str
    pod_root: Path
    """`pod_root/<rljob>` is the job's working directory (the test puts the data the RLJob names there)."""
    pod_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the Ray containers (e.g. KUBECONFIG standing in for in-cluster credentials)."""
    num_cpus: int = 2
    heads: dict[str, Head] = field(default_factory=dict)
    submitters: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.proxy = _Proxy(self._head_of_service).serve_in_background()

    def proxy_env(self) -> dict[str, str]:
        """For KubeRay's controller: its dashboard client reaches `<cluster>-head-svc` through the proxy."""
        url = f"http://{self.proxy.address}"
        loopback = "127.0.0.1,localhost"
        return {"HTTP_PROXY": url, "http_proxy": url, "NO_PROXY": loopback, "no_proxy": loopback}

    def unauthorized(self) -> list[str]:
        """Calls of KubeRay's dashboard client (through `proxy_env()`) that the Ray dashboard refused (401, 403)."""
        return list(self.proxy.unauthorized)

    def stop(self) -> None:
        with self._lock:
            for process in self.submitters.values():
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            for head in self.heads.values():
                head.kill()
            self.submitters.clear()
            self.heads.clear()
        self.proxy.shutdown()
        self.proxy.server_close()

    # ---- what the stand-in kubelet asks ---------------------------------------------------------------

    def state(self, pod: dict[str, Any]) -> str | int:
        """ "creating", "running", or the exit code of the pod's (only) container."""
        labels = pod["metadata"].get("labels") or {}
        if labels.get("ray.io/node-type") == "head":
            return self._head_state(pod)
        if labels.get("batch.kubernetes.io/job-name"):
            return self._submitter_state(pod)
        return "running"

    def forget(self, name: str) -> None:
        """The pod is deleted: its processes die with it."""
        with self._lock:
            head = self.heads.pop(name, None)
            submitter = self.submitters.pop(name, None)
        if head is not None:
            head.kill()
        if submitter is not None and submitter.poll() is None:
            os.killpg(submitter.pid, signal.SIGKILL)
            submitter.wait()

    def exec(self, pod: dict[str, Any], command: list[str]) -> subprocess.Popen[bytes] | None:
        """A command in a head pod's container (a preStop hook): a local process with the container's environment,
        in the job's folder, its arguments rewritten as the entrypoint's are. None for the other pods (no process
        of theirs runs here)."""
        with self._lock:
            head = self.heads.get(pod["metadata"]["name"])
        if head is None or not head.ready:
            return None
        argv = [head.local(arg) for arg in command]
        log = head.workdir / f"{head.pod}.prestop.log"
        with open(log, "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=head.env, cwd=head.workdir)

    def terminate(self, name: str) -> None:
        """SIGTERM to the main process of pod `name`'s container, if it runs here."""
        with self._lock:
            head = self.heads.get(name)
        if head is not None:
            head.terminate()

    def exited(self, name: str) -> bool:
        with self._lock:
            head = self.heads.get(name)
        return head is None or head.process is None or head.process.poll() is not None

    def head_of(self, rljob: str) -> Head | None:
        return next((h for h in self.heads.values() if h.workdir.name == rljob and h.ready), None)

    # ---- head pods ----------------------------------------------------------------------------------

    def _head_state(self, pod: dict[str, Any]) -> str | int:
        name = pod["metadata"]["name"]
        with self._lock:
            head = self.heads.get(name)
            if head is None:
                labels = pod["metadata"]["labels"]
                workdir = self.pod_root / labels.get(RLJOB_LABEL, labels["ray.io/cluster"])
                head = self.heads[name] = Head(name, labels["ray.io/cluster"], workdir, {})
                threading.Thread(target=self._start_head, args=(head, pod), daemon=True).start()
        if head.error:
            return 1
        if head.process is not None and head.process.poll() is not None:
            return head.process.returncode or 1
        return "running" if head.ready else "creating"

    def _start_head(self, head: Head, pod: dict[str, Any]) -> None:
        try:
            container = pod["spec"]["containers"][0]
            head.workdir.mkdir(parents=True, exist_ok=True)
            head.mounts = self._write_volumes(pod["spec"], container, head.workdir)
            env = {**os.environ, **self._template_env(head.cluster), **self._auth_env(container), **self.pod_env}
            env |= RAY_ENV
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
            head.env = env
            head.dashboard_port, agent_port = free_port(), free_port()
            # Ray's socket paths must fit in 107 bytes: a short folder of its own, not one under pytest's tmp_path.
            head.ray_dir = Path(tempfile.mkdtemp(prefix="krl-"))
            command = [
                str(Path(sys.executable).parent / "ray"),
                "start",
                "--head",
                "--block",
                f"--port={free_port()}",
                f"--dashboard-port={head.dashboard_port}",
                "--dashboard-host=127.0.0.1",
                "--node-ip-address=127.0.0.1",
                f"--num-cpus={self.num_cpus}",
                "--num-gpus=0",
                f"--temp-dir={head.ray_dir}",
                "--include-dashboard=true",
                f"--dashboard-agent-listen-port={agent_port}",
            ]
            log = head.workdir / f"{head.pod}.log"
            with open(log, "wb") as out:
                head.process = subprocess.Popen(
                    command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=head.workdir, start_new_session=True
                )
            self._wait_for_dashboard(head, agent_port, log)
            head.service = _Proxy(lambda _host: head).serve_in_background()
            head.ready = True
        except Exception as exc:  # the pod's container fails to start: the kubelet reports it
            head.error = repr(exc)

    def _wait_for_dashboard(self, head: Head, agent_port: int, log: Path, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert head.process is not None
            if head.process.poll() is not None:
                raise RuntimeError(f"ray head exited:\n{log.read_text()[-3000:]}")
            try:
                # KubeRay's readiness probe: the dashboard agent's raylet check and the dashboard's GCS check, both
                # public with token authentication on; before the agent answers, a job submission gets a 500
                for url in (
                    f"http://127.0.0.1:{agent_port}/api/local_raylet_healthz",
                    f"http://127.0.0.1:{head.dashboard_port}/api/gcs_healthz",
                ):
                    with urllib.request.urlopen(url, timeout=2):
                        pass
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"ray dashboard not up after {timeout:.0f} s:\n{log.read_text()[-3000:]}")

    def _template_env(self, cluster: str) -> dict[str, str]:
        """The head container's environment as the RayCluster's template declares it (not KubeRay's additions,
        whose addresses name in-cluster ports), with Secret and ConfigMap references resolved."""
        raycluster = self.custom.get_namespaced_custom_object("ray.io", "v1", self.namespace, "rayclusters", cluster)
        container = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        return self._resolve_env(container.get("env") or [])

    def _auth_env(self, container: dict[str, Any]) -> dict[str, str]:
        """The Ray token variables KubeRay adds to the head pod's container (authOptions; not in the template),
        the token resolved from KubeRay's Secret."""
        return self._resolve_env([e for e in container.get("env") or [] if e["name"] in RAY_AUTH_ENV])

    def _resolve_env(self, env: list[dict[str, Any]]) -> dict[str, str]:
        resolved: dict[str, str] = {}
        for var in env:
            source = var.get("valueFrom") or {}
            if "value" in var:
                resolved[var["name"]] = str(var["value"])
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                data = self.core.read_namespaced_secret(ref["name"], self.namespace).data or {}
                resolved[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                resolved[var["name"]] = (self.core.read_namespaced_config_map(ref["name"], self.namespace).data or {})[
                    ref["key"]
                ]
        return resolved

    def _write_volumes(self, pod_spec: dict[str, Any], container: dict[str, Any], workdir: Path) -> dict[str, Path]:
        """The pod's volumes as local folders; returns mount path → local folder. A claim is a folder of its own
        under `pod_root/claims/<claim>` (it outlives the pod, as a volume does, and no two claims share one); a
        ConfigMap is written into the job's folder, its files naming the claims' mount paths by their folders (the
        spec's resolved checkpointDir), since no mount namespace puts a claim at its mount path here."""
        volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            claim = volumes.get(mount["name"], {}).get("persistentVolumeClaim")
            if claim:
                local = self.pod_root / "claims" / claim["claimName"]
                local.mkdir(parents=True, exist_ok=True)
                mounts[mount["mountPath"]] = local
        claims = sorted(mounts.items(), key=lambda item: -len(item[0]))  # the longest mount path first
        for mount in container.get("volumeMounts") or []:
            source = volumes.get(mount["name"], {}).get("configMap")
            if not source:
                continue
            local = workdir / "mounts" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            for key, value in (self.core.read_namespaced_config_map(source["name"], self.namespace).data or {}).items():
                for mount_path, folder in claims:
                    value = value.replace(mount_path, str(folder))
                (local / key).write_text(value)
            mounts[mount["mountPath"]] = local
        return mounts

    # ---- submitter pods -----------------------------------------------------------------------------

    def _submitter_state(self, pod: dict[str, Any]) -> str | int:
        name = pod["metadata"]["name"]
        with self._lock:
            process = self.submitters.get(name)
            if process is None:
                process = self.submitters[name] = self._start_submitter(pod)
        code = process.poll()
        return "running" if code is None else code

    def _start_submitter(self, pod: dict[str, Any]) -> subprocess.Popen[bytes]:
        container = pod["spec"]["containers"][0]
        argv = [self._dns(arg) for arg in [*(container.get("command") or []), *(container.get("args") or [])]]
        env = {**os.environ, **RAY_ENV, **{k: self._dns(v) for k, v in self._resolve_env(container["env"]).items()}}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        log_dir = self.pod_root / "submitters"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{pod['metadata']['name']}.log", "wb") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _dns(self, text: str) -> str:
        """Cluster DNS for a pod: a head Service's name and port become its local address."""

        def address(match: re.Match[str]) -> str:
            head = self._head_of_service(match.group(0))
            return head.service.address if head is not None and head.service is not None else match.group(0)

        return SERVICE_HOST.sub(address, text)

    def _head_of_service(self, host: str) -> Head | None:
        match = SERVICE_HOST.fullmatch(host)
        if match is None or match.group(2) != self.namespace:
            return None
        try:
            service = self.core.read_namespaced_service(match.group(1), self.namespace)
        except client.ApiException:
            return None
        cluster = (service.spec.selector or {}).get("ray.io/cluster")
        return next((h for h in list(self.heads.values()) if h.cluster == cluster), None)
