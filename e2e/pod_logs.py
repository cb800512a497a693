"""The stand-in kubelet's log endpoint, which the harness has none of: `kubectl logs` (pods/log) through the real
kube-apiserver to a container that really runs here.

    logs = PodLogs(api_client, claims=tmp_path / "claims").start(["node-1"])
    ...   # GET pods/NAME/log[?follow=true] answers with the output of the pod's container command

The apiserver proxies pods/log to `https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/
NS/POD/CONTAINER` (without a kubelet CA configured it does not verify the serving certificate): `start` writes that
address into each fake Node's status. A request runs the container's `command` + `args` here, with each path under
a volume mount rewritten to the folder of its volume: a claim is `claims/<claimName>`, as `e2e/raypods.py` mounts
claims. With follow the output streams until the command ends or the client goes; otherwise all of it is returned.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from e2e.pki import CertificateAuthority


class PodLogs:
    def __init__(self, api_client: client.ApiClient, claims: Path) -> None:
        self.core = client.CoreV1Api(api_client)
        self.api = api_client
        self.claims = claims
        self.requests: list[str] = []
        self._pki = Path(tempfile.mkdtemp(prefix="kubelet-pki-"))
        self._server: ThreadingHTTPServer | None = None

    def start(self, nodes: list[str]) -> PodLogs:
        pair = CertificateAuthority(self._pki).issue("kubelet", "stand-in-kubelet", server_hosts=("127.0.0.1",))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pair.cert, pair.key)
        handler = type("Handler", (_Handler,), {"logs": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        port = self._server.server_address[1]
        for node in nodes:
            status = {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            }
            self.core.patch_node_status(node, {"status": status})
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        shutil.rmtree(self._pki, ignore_errors=True)

    def __enter__(self) -> PodLogs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def command(self, namespace: str, pod_name: str, container_name: str) -> list[str]:
        """The container's command as it runs here: mount paths rewritten to the volumes' local folders."""
        pod: dict[str, Any] = self.api.sanitize_for_serialization(self.core.read_namespaced_pod(pod_name, namespace))
        container = next(c for c in pod["spec"]["containers"] if c["name"] == container_name)
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        roots: list[tuple[str, str]] = []
        for mount in container.get("volumeMounts", []):
            claim = volumes.get(mount["name"], {}).get("persistentVolumeClaim")
            if claim:
                roots.append((mount["mountPath"].rstrip("/"), str(self.claims / claim["claimName"])))
        words = [*container.get("command", []), *container.get("args", [])]
        return [_rewrite(word, roots) for word in words]


def _rewrite(word: str, roots: list[tuple[str, str]]) -> str:
    for mount, local in sorted(roots, key=lambda r: -len(r[0])):
        if word == mount or word.startswith(mount + "/"):
            return local + word[len(mount) :]
    return word


class _Handler(BaseHTTPRequestHandler):
    logs: PodLogs
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self.send_error(404)
            return
        _, namespace, pod, container = parts
        self.logs.requests.append(self.path)
        follow = parse_qs(url.query).get("follow") == ["true"]
        process = subprocess.Popen(
            self.logs.command(namespace, pod, container), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert process.stdout is not None
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            reader = process.stdout.read1 if follow else process.stdout.read
            while chunk := reader(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        finally:
            process.kill()
            process.wait()

    def log_message(self, format: str, *args: Any) -> None:
        return
