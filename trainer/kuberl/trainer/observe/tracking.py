"""The experiment trackers a run reports to (trainer.loggers wandb and mlflow), named by trainer.tracking.

- W&B (`kuberl[wandb]`, in the trainer image): online when WANDB_API_KEY is set (on Kubernetes from a Secret through
  cluster.env valueFrom), else offline into the run folder (`wandb sync` uploads it later); WANDB_MODE, when set,
  decides. Project and run name: trainer.tracking.project and runName (default the RLJob's name).
- MLflow: the tracking server's REST API (no client package in the image): the experiment trainer.tracking.project,
  created when missing; one run per attempt, named runName and tagged with the RLJob; each step's metrics in one
  log-batch call; credentials from MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kuberl.api.spec import Tracking

log = logging.getLogger(__name__)
MLFLOW_API = "/api/2.0/mlflow"
MLFLOW_BATCH = 1000  # log-batch takes at most 1000 metrics per call
RLJOB_TAG = "kuberl.rljob"  # on the MLflow run: the RLJob it belongs to (namespace/name)


def run_name(tracking: Tracking, rljob: str) -> str:
    return tracking.run_name or rljob


def wandb_mode(env: Mapping[str, str]) -> str:
    """WANDB_MODE when set; else online with an API key (from a Secret), offline without."""
    return env.get("WANDB_MODE") or ("online" if env.get("WANDB_API_KEY") else "offline")


class WandbSink:
    def __init__(self, folder: Path, rljob: str, tracking: Tracking, config: dict[str, Any]) -> None:
        import wandb

        mode = wandb_mode(os.environ)
        name = run_name(tracking, rljob)
        settings: dict[str, Any] = {"project": tracking.project, "name": name, "dir": str(folder), "mode": mode}
        self.run = wandb.init(**settings, config=config)
        where = "online" if mode == "online" else f"offline in {folder / 'wandb'} (no WANDB_API_KEY: wandb sync it)"
        log.info("wandb: project %s, run %s, %s", tracking.project, name, where)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowError(RuntimeError):
    """A call to the tracking server that failed: the endpoint and the server's answer."""


class MlflowSink:
    def __init__(self, rljob: str, namespace: str, tracking: Tracking, params: dict[str, str]) -> None:
        if not tracking.mlflow_tracking_uri:
            raise MlflowError("trainer.tracking.mlflowTrackingURI is not set")
        self.base = tracking.mlflow_tracking_uri.rstrip("/") + MLFLOW_API
        experiment = self._experiment(tracking.project)
        tags = [{"key": "mlflow.runName", "value": run_name(tracking, rljob)}]
        tags.append({"key": RLJOB_TAG, "value": f"{namespace}/{rljob}"})
        run = self.call(
            "runs/create",
            {"experiment_id": experiment, "run_name": run_name(tracking, rljob), "start_time": _now(), "tags": tags},
        )
        self.run_id: str = run["run"]["info"]["run_id"]
        items = [{"key": k[:250], "value": v[:6000]} for k, v in params.items()]
        for start in range(0, len(items), 100):
            self.call("runs/log-batch", {"run_id": self.run_id, "params": items[start : start + 100]})
        log.info("mlflow: experiment %s, run %s at %s", tracking.project, self.run_id, tracking.mlflow_tracking_uri)

    def _experiment(self, name: str) -> str:
        try:
            found = self.call("experiments/get-by-name", {"experiment_name": name}, method="GET")
            return str(found["experiment"]["experiment_id"])
        except MlflowError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
        return str(self.call("experiments/create", {"name": name})["experiment_id"])

    def call(self, endpoint: str, body: dict[str, Any], method: str = "POST") -> dict[str, Any]:
        url = f"{self.base}/{endpoint}"
        data = None
        if method == "GET":
            url += "?" + urllib.parse.urlencode(body)
        else:
            data = json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers=_headers())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                result: dict[str, Any] = json.loads(response.read() or b"{}")
                return result
        except urllib.error.HTTPError as exc:
            raise MlflowError(f"{method} {url}: {exc.code} {exc.read().decode(errors='replace')[:500]}") from exc
        except urllib.error.URLError as exc:
            raise MlflowError(f"{method} {url}: {exc.reason}") from exc

    def log(self, step: int, metrics: dict[str, float]) -> None:
        at = _now()
        items = [{"key": k, "value": v, "timestamp": at, "step": step} for k, v in metrics.items() if v == v]
        for start in range(0, len(items), MLFLOW_BATCH):
            self.call("runs/log-batch", {"run_id": self.run_id, "metrics": items[start : start + MLFLOW_BATCH]})

    def close(self) -> None:
        self.call("runs/update", {"run_id": self.run_id, "status": "FINISHED", "end_time": _now()})


def _now() -> int:
    return int(time.time() * 1000)


def _headers() -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif user and password:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return headers


def params_of(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The spec as flat MLflow params (`algorithm.kl.coef` → "0.001")."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(params_of(value, name))
        else:
            flat[name] = json.dumps(value) if isinstance(value, (list, bool)) or value is None else str(value)
    return flat
