"""The experiment trackers: the mlflow logger against a real MLflow tracking server, the wandb logger offline (what
it wrote read back), both named by trainer.tracking; W&B goes online with an API key."""

from __future__ import annotations

import json
import struct
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from e2e.fixtures import missing_tool
from kuberl.trainer.observe.metrics import MetricsLogger
from kuberl.trainer.observe.tracking import wandb_mode
from tests.trainer.mlflow_server import MLFLOW_VERSION, Unavailable, mlflow_command, mlflow_server

BLOCK = 32768  # the .wandb file's block size
STEPS = [
    {"critic/score/mean": 0.25, "actor/pg_loss": -0.5, "perf/mfu/actor": 0.31},
    {"critic/score/mean": 0.5, "actor/pg_loss": -0.25, "perf/mfu/actor": 0.32},
]


def config(**tracking: Any) -> dict[str, Any]:
    return {"algorithm": {"advantageEstimator": "grpo"}, "trainer": {"tracking": tracking}}


def get(url: str, endpoint: str, **query: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}") as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_mlflow_logs_every_step_under_the_project_and_run_name(tmp_path: Path) -> None:
    try:
        mlflow_command()
    except Unavailable as exc:
        missing_tool(f"mlflow {MLFLOW_VERSION} from PyPI: {exc}")
    with mlflow_server(tmp_path) as url:
        spec = config(project="gsm8k-team", runName="grpo lr 1e-6", mlflowTrackingURI=url)
        logger = MetricsLogger(
            tmp_path / "run",
            loggers=["mlflow"],
            rljob="gsm8k",
            namespace="rl-team",
            metrics_port=0,
            total_steps=2,
            config=spec,
        )
        assert [type(s).__name__ for s in logger.sinks] == ["MlflowSink"]
        for step, metrics in enumerate(STEPS, start=1):
            logger.log(step, metrics)
        logger.close()
        experiment = get(url, "experiments/get-by-name", experiment_name="gsm8k-team")["experiment"]
        with urllib.request.urlopen(
            urllib.request.Request(
                f"{url}/api/2.0/mlflow/runs/search",
                data=json.dumps({"experiment_ids": [experiment["experiment_id"]]}).encode(),
                headers={"Content-Type": "application/json"},
            )
        ) as response:
            (run,) = json.loads(response.read())["runs"]
        info, data = run["info"], run["data"]
        assert info["run_name"] == "grpo lr 1e-6" and info["status"] == "FINISHED"
        assert {"key": "kuberl.rljob", "value": "rl-team/gsm8k"} in data["tags"]
        assert {"key": "algorithm.advantageEstimator", "value": "grpo"} in data["params"]
        history = get(url, "metrics/get-history", run_id=info["run_id"], metric_key="critic/score/mean")["metrics"]
        assert [(m["step"], m["value"]) for m in history] == [(1, 0.25), (2, 0.5)]


def test_mlflow_unreachable_disables_the_sink_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = config(mlflowTrackingURI="http://127.0.0.1:1")
    logger = MetricsLogger(
        tmp_path,
        loggers=["console", "mlflow"],
        rljob="x",
        namespace="ns",
        metrics_port=0,
        total_steps=1,
        write=lambda line: None,
        config=spec,
    )
    assert [type(s).__name__ for s in logger.sinks] == ["ConsoleSink"]
    assert "metrics sink mlflow disabled" in caplog.text and "127.0.0.1:1" in caplog.text


def test_wandb_offline_writes_the_run_under_the_project_and_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = MetricsLogger(
        tmp_path,
        loggers=["wandb"],
        rljob="gsm8k",
        namespace="ns",
        metrics_port=0,
        total_steps=2,
        config=config(project="gsm8k-team", runName="grpo-lr-1e-6"),
    )
    assert [type(s).__name__ for s in logger.sinks] == ["WandbSink"]
    for step, metrics in enumerate(STEPS, start=1):
        logger.log(step, metrics)
    logger.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    records = finished_records(run)
    (header,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (header.project, header.display_name) == ("gsm8k-team", "grpo-lr-1e-6")
    history = [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [(h["_step"], h["critic/score/mean"]) for h in history if "critic/score/mean" in h] == [(1, 0.25), (2, 0.5)]


def finished_records(run: Path, timeout: float = 60) -> list[Any]:
    """The records of the offline run folder ``run`` once its exit record is on disk: wandb's service process writes
    the file behind ``finish()``, and on a loaded machine it was found still empty as ``finish()`` returned."""
    deadline = time.monotonic() + timeout
    while True:
        records = wandb_records(next(run.glob("run-*.wandb")))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of an offline run's .wandb file: a 7-byte header, then LevelDB-log framing (32 KiB
    blocks of records with a 7-byte header: crc32, length, type; FULL=1 or FIRST/MIDDLE/LAST=2/3/4 fragments)."""
    from wandb.proto import wandb_internal_pb2

    data, position, fragment, records = path.read_bytes(), 7, b"", []
    while position + 7 <= len(data):
        if BLOCK - position % BLOCK < 7:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        fragment += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(fragment)
            records.append(record)
        if kind in (0, 1, 4):
            fragment = b""
    return records


@pytest.mark.parametrize(
    ("env", "mode"),
    [({}, "offline"), ({"WANDB_API_KEY": "k"}, "online"), ({"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}, "offline")],
)
def test_wandb_is_online_with_a_key_from_a_secret(env: dict[str, str], mode: str) -> None:
    assert wandb_mode(env) == mode
