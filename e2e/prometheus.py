"""A real Prometheus server for tests: scrapes the targets you give it, answers PromQL over its HTTP API.

    from e2e.prometheus import Prometheus, ScrapeJob
    with Prometheus([ScrapeJob("trainer", ["127.0.0.1:9400"], labels={"namespace": "ns"})]) as prom:
        prom.wait_for_targets()                     # every target scraped successfully at least once
        prom.query('kuberl_step{namespace="ns"}')   # the result list of /api/v1/query
    Prometheus(jobs, rules={"groups": [...]})       # alerting rules too: prom.alerts(), prom.rule_health()

The binary is the Debian/Ubuntu package's `/usr/bin/prometheus` (`apt-get install -y prometheus`), or
`KUBERL_PROMETHEUS`, or `prometheus` on PATH. The package's own service is not used: each `Prometheus` runs a
private server on a free loopback port with its data in a temp dir, killed with the test process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.harness import free_port

INSTALL_HINT = "apt-get install -y prometheus"


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the test process dies."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class PrometheusMissing(RuntimeError):
    """No prometheus binary; the message says how to install one."""


def find_prometheus() -> Path:
    """`KUBERL_PROMETHEUS`, else `/usr/bin/prometheus` (Debian package), else `prometheus` on PATH."""
    override = os.environ.get("KUBERL_PROMETHEUS")
    candidates = [Path(override)] if override else [Path("/usr/bin/prometheus")]
    on_path = shutil.which("prometheus")
    if on_path and not override:
        candidates.append(Path(on_path))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    where = f"KUBERL_PROMETHEUS={override} is not executable" if override else "no prometheus binary"
    raise PrometheusMissing(f"{where}: run `{INSTALL_HINT}` (Debian/Ubuntu) or set KUBERL_PROMETHEUS")


@dataclass
class ScrapeJob:
    """One scrape job of static targets (`host:port`), with the labels every target's series get."""

    name: str
    targets: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    path: str = "/metrics"
    honor_labels: bool = False

    def config(self, interval: str) -> dict[str, Any]:
        return {
            "job_name": self.name,
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "metrics_path": self.path,
            "honor_labels": self.honor_labels,
            "static_configs": [{"targets": list(self.targets), "labels": dict(self.labels)}],
        }


class PrometheusError(RuntimeError):
    pass


@dataclass
class Prometheus:
    jobs: Iterable[ScrapeJob]
    scrape_interval: str = "1s"
    binary: Path | None = None
    start_timeout: float = 30.0
    # rule groups (`{"groups": [...]}`, as in a PrometheusRule's spec), evaluated every scrape interval
    rules: dict[str, Any] | None = None

    url: str = field(init=False, default="")
    workdir: Path = field(init=False, default=Path())
    _popen: subprocess.Popen | None = field(init=False, default=None)

    def start(self) -> Prometheus:
        binary = self.binary or find_prometheus()
        self.workdir = Path(tempfile.mkdtemp(prefix="kuberl-prometheus-"))
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [job.config(self.scrape_interval) for job in self.jobs],
        }
        if self.rules is not None:
            (self.workdir / "rules.yml").write_text(yaml.safe_dump(self.rules, sort_keys=False))
            config["rule_files"] = [str(self.workdir / "rules.yml")]
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = self.workdir / "prometheus.log"
        with open(self._log, "wb") as log:
            self._popen = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._popen.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self._popen.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise PrometheusError(f"prometheus not ready after {self.start_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
        self._popen = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ---- HTTP API ------------------------------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str | list[str]] | None = None) -> Any:
        """GET /api/v1/<path>; returns `data`, raises PrometheusError with Prometheus's message on an error."""
        query = urllib.parse.urlencode(params or {}, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {dict(params or {})}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at now; the `result` list (vector) or [scalar] for a scalar result."""
        data = self.api("query", {"query": expr})
        return data["result"] if data["resultType"] in ("vector", "matrix") else [data["result"]]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending or firing) of the loaded rules."""
        return self.api("alerts")["alerts"]

    def rule_health(self) -> dict[str, tuple[str, str]]:
        """Every loaded rule's name -> (health, lastError): "ok" once evaluated without error."""
        return {
            r["name"]: (r["health"], r.get("lastError", "")) for g in self.api("rules")["groups"] for r in g["rules"]
        }

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        return self.api(f"label/{label}/values", {"match[]": [match]} if match else None)

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def wait_for_targets(self, timeout: float = 30.0, scrapes: int = 1) -> None:
        """Until every target's last scrape succeeded (`scrapes` > 1: and that many intervals have passed)."""
        deadline = time.monotonic() + timeout
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            targets = self.targets()
            if targets and all(t["health"] == "up" for t in targets):
                time.sleep(max(0, scrapes - 1) * _seconds(self.scrape_interval))
                return
            time.sleep(0.2)
        down = [f"{t['scrapePool']} {t['scrapeUrl']}: {t['health']} {t.get('lastError', '')}" for t in targets]
        listing = "\n".join(down) or "(no targets)"
        raise PrometheusError(f"targets not up after {timeout:.0f} s:\n{listing}")

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Until `expr` returns at least one series; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in ("ms", "s", "m", "h"):
        if duration.endswith(suffix):
            return float(duration[: -len(suffix)]) * units[suffix]
    return float(duration)
