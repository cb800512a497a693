"""SIGINT (Ctrl-C) and SIGTERM (Kubernetes, Ray): the run finishes the current step, saves a checkpoint there and
exits with 128 + the signal (130, 143); resume continues."""

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from tests.trainer.kuberl_cli import REPO, cli_env, run_command

TINY = "tiny://llama?hidden=32&layers=1&heads=2&kv_heads=1&seed=0"


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("signum", "code", "whole_group"),
    [
        # Ctrl-C: the terminal signals the foreground process group, the embedded Ray's processes included
        (signal.SIGINT, 130, True),
        # SIGTERM: `kill`, `timeout`, and Ray's job stop that the pods' preStop hook calls signal the driver itself
        (signal.SIGTERM, 143, False),
    ],
)
def test_a_stop_signal_saves_a_checkpoint_at_the_step_boundary_and_exits_128_plus_it(
    tmp_path, signum, code, whole_group
):
    doc = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "interrupted"},
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
                "checkpointDir": str(tmp_path / "ckpt"),
                "metricsPort": 0,
                "valBeforeTrain": False,
                "loggers": ["jsonl"],
            },
            "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        },
    }
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    env = cli_env()
    metrics = tmp_path / "run" / "metrics.jsonl"
    # a session of its own, so that a signal to its process group reaches this run's processes only
    proc = subprocess.Popen(
        run_command(str(spec_file), str(tmp_path / "run")),
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        if whole_group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, output[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    latest = (tmp_path / "ckpt" / "latest").read_text().strip()
    assert latest == f"global_step_{steps[-1]}"
    state = json.loads((tmp_path / "ckpt" / latest / "trainer_state.json").read_text())
    assert state["step"] == steps[-1] < 1000
    assert "interrupted: checkpoint saved" in output
