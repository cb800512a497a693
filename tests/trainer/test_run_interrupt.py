"""SIGINT (Ctrl-C) and SIGTERM (Kubernetes, Ray): the run finishes the current step, saves a checkpoint there and
exits with 128 + the signal (130, 143); resume continues."""

import json
import os
import signal
import time

import pytest
import yaml

from tests.trainer.kuberl_cli import run_command, start_in_session, tiny_job


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
    doc = tiny_job("interrupted", tmp_path / "ckpt")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    metrics = tmp_path / "run" / "metrics.jsonl"
    proc = start_in_session(run_command(str(spec_file), str(tmp_path / "run")))
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
