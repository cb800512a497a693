"""`kuberl run` as a user starts it: a process of its own, from the repository root, importing this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from kuberl.trainer.observe.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout's four package folders first on PYTHONPATH."""
    path = [str(REPO / p) for p in ("api", "operator", "sandbox", "trainer")] + [os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def run_command(spec_file: Path | str, run_dir: Path | str) -> list[str]:
    """`kuberl run SPEC --run-dir DIR --no-progress` with this interpreter."""
    return [sys.executable, "-m", "kuberl.cli", "run", str(spec_file), "--run-dir", str(run_dir), "--no-progress"]


def kuberl_run(spec_file: Path | str, run_dir: Path | str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `kuberl run` to its end from the repository root; output captured as text."""
    command = run_command(spec_file, run_dir)
    return subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=timeout)


TINY = "tiny://llama?hidden=32&layers=1&heads=2&kv_heads=1&seed=0"


def tiny_job(name: str, checkpoint_dir: Path | str, **trainer: Any) -> dict[str, Any]:
    """A GRPO RLJob on the tiny model and the digits data, on one CPU rank, writing only metrics.jsonl: the
    trainer process tests' run; ``trainer`` adds to or overrides spec.trainer (1000 steps by default)."""
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": TINY, "dtype": "float32", "gradientCheckpointing": False},
            "algorithm": {"advantageEstimator": "grpo"},
            "data": {
                "trainFiles": [str(REPO / "examples/data/digits-train.parquet")],
                "maxPromptLength": 64,
                "maxResponseLength": 2,
            },
            "reward": {"function": "default"},
            "batch": {"trainBatchSize": 4, "rolloutN": 2, "ppoMiniBatchSize": 4, "ppoMicroBatchSizePerGPU": 8},
            "rollout": {"engine": "hf"},
            "trainer": {
                "totalSteps": 1000,
                "checkpointDir": str(checkpoint_dir),
                "metricsPort": 0,
                "valBeforeTrain": False,
                "loggers": ["jsonl"],
                **trainer,
            },
            "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        },
    }


def start_in_session(command: list[str]) -> subprocess.Popen[str]:
    """``command`` from the repository root in a session of its own (a signal to its group reaches only it),
    output merged and captured as text."""
    return subprocess.Popen(
        command,
        cwd=REPO,
        env=cli_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def example_run(
    example: str, tmp_path: Path, *, steps: int, timeout: float, seed: int | None = None
) -> list[dict[str, Any]]:
    """The step records of `kuberl run examples/<example>` as a learning check runs it: the example's data and model
    from the checkout, no validation, no checkpoints, metrics in metrics.jsonl only; ``seed`` replaces the example's
    data.seed (its data order, sampling and initialisation)."""
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    spec = doc["spec"]
    if (REPO / spec["model"]["path"]).exists():
        spec["model"]["path"] = str(REPO / spec["model"]["path"])
    spec["data"]["trainFiles"] = [str(REPO / f) for f in spec["data"]["trainFiles"]]
    spec["data"]["valFiles"] = []
    if seed is not None:
        spec["data"]["seed"] = seed
    assert spec["trainer"]["totalSteps"] == steps  # the example is the learning run
    spec["trainer"].update(
        testFreq=-1,
        saveFreq=-1,
        valBeforeTrain=False,
        checkpointDir=str(tmp_path / "ckpt"),
        metricsPort=0,
        loggers=["jsonl"],
    )
    spec_file = tmp_path / example
    spec_file.write_text(yaml.safe_dump(doc))
    result = kuberl_run(spec_file, tmp_path / "run", timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "critic/score/mean" in r]
    assert len(records) == steps
    return records


def window_means(records: list[dict[str, Any]], key: str, window: int) -> tuple[float, float]:
    """The mean of `key` over the first and over the last `window` records."""
    values = [float(r[key]) for r in records]
    return sum(values[:window]) / window, sum(values[-window:]) / window
