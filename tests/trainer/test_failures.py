"""Failures a retry cannot fix end the trainer with EXIT_PERMANENT; the rest stay transient (raised, exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kuberl.api import InvalidSpec
from kuberl.api.contract import EXIT_PERMANENT
from kuberl.api.status import FailureClass
from kuberl.trainer.checkpoint.files import CheckpointMismatch
from kuberl.trainer.checkpoint.folder import CheckpointFolderInUse, CheckpointStorageError
from kuberl.trainer.data.prompts import DataError
from kuberl.trainer.driver.failures import PERMANENT_ERRORS, classify
from kuberl.trainer.rewards.functions import RewardFunctionError
from kuberl.trainer.workers.base import NonFiniteStepsError

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny://llama?hidden=32&layers=1&heads=2&kv_heads=1&seed=0"


class RewardTimeout(RewardFunctionError):
    """What a reward timeout is: a subclass of the reward function's error."""


@pytest.mark.parametrize(
    "exc",
    [DataError("bad row"), RewardTimeout("scoring took over 30 s"), InvalidSpec([]), FileNotFoundError("x")],
    ids=["data", "reward-subclass", "spec", "plain-file-not-found"],
)
def test_classes_are_named_by_their_bases(exc: BaseException) -> None:
    failure = classify(exc)
    permanent = isinstance(exc, PERMANENT_ERRORS)
    assert failure.kind == (FailureClass.PERMANENT if permanent else FailureClass.TRANSIENT)
    assert failure.error == type(exc).__name__


def test_a_permanent_error_wrapped_by_a_transient_one_is_permanent() -> None:
    try:
        try:
            raise DataError("row 3: missing column 'prompt'")
        except DataError as inner:
            raise RuntimeError("actor died") from inner
    except RuntimeError as outer:
        failure = classify(outer)
    assert (failure.kind, failure.error, failure.message) == (
        FailureClass.PERMANENT,
        "DataError",
        "row 3: missing column 'prompt'",
    )


@pytest.mark.parametrize(
    "exc",
    [
        CheckpointMismatch("a changed spec.batch refuses the resume"),
        CheckpointFolderInUse("another RLJob's checkpoints"),
        CheckpointStorageError("no space left for the next checkpoint"),
        NonFiniteStepsError("10 optimizer steps in a row had a non-finite gradient norm"),
    ],
    ids=["refused-resume", "folder-in-use", "storage", "non-finite-steps"],
)
def test_what_every_retry_would_meet_again_is_permanent(exc: BaseException) -> None:
    assert classify(exc).kind == FailureClass.PERMANENT


def test_an_oom_or_lost_node_is_transient() -> None:
    assert classify(MemoryError()).kind == FailureClass.TRANSIENT
    assert classify(ConnectionError("GCS unreachable")).kind == FailureClass.TRANSIENT


def _spec(train_file: Path, tmp_path: Path) -> dict:
    return {
        "model": {"path": TINY, "dtype": "float32", "gradientCheckpointing": False},
        "algorithm": {"advantageEstimator": "grpo"},
        "data": {"trainFiles": [str(train_file)], "maxPromptLength": 64, "maxResponseLength": 2},
        "reward": {"function": "default"},
        "batch": {"trainBatchSize": 4, "rolloutN": 2, "ppoMiniBatchSize": 4, "ppoMicroBatchSizePerGPU": 8},
        "rollout": {"engine": "hf"},
        "trainer": {"totalSteps": 2, "checkpointDir": str(tmp_path / "ckpt"), "metricsPort": 0},
        "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
    }


@pytest.mark.timeout(120)
def test_a_truncated_data_file_exits_permanent_before_ray_starts(tmp_path: Path) -> None:
    """The entrypoint on a real truncated parquet file: exit EXIT_PERMANENT with the error, no traceback to stdout."""
    data = (REPO / "examples/data/digits-train.parquet").read_bytes()
    truncated = tmp_path / "train.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(_spec(truncated, tmp_path)))
    proc = subprocess.run(
        [sys.executable, "-m", "kuberl.trainer.run", "--spec-file", str(spec_file), "--name", "bad-data"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == EXIT_PERMANENT, proc.stderr[-3000:]
    assert f"error: DataError: {truncated}" in proc.stderr
    assert "ray.init" not in proc.stderr and "Started a local Ray instance" not in proc.stderr
