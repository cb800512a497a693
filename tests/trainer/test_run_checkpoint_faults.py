"""Real trainer processes meeting checkpoint faults (issue 38): a second trainer on a folder in use, a read-only
and a full filesystem, a resume the changed spec refuses, a finished run started again (its last lines and its
export too: one finished run serves them all). What a retry would meet
again ends the entrypoint with EXIT_PERMANENT, naming the folder and what to do."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.contract import EXIT_PERMANENT, EXIT_STOPPED
from kuberl.trainer.checkpoint import files as ckpt
from kuberl.trainer.checkpoint import folder as ckpt_folder
from tests.trainer.kuberl_cli import REPO, cli_env, run_command, start_in_session, tiny_job


def job(checkpoint_dir: Path, **trainer: Any) -> dict[str, Any]:
    doc = tiny_job("faults", checkpoint_dir, saveFreq=1, **trainer)
    doc["spec"]["runPolicy"] = {"terminationGracePeriodSeconds": 2}  # how long a second trainer waits for the folder
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


RAY_STARTED = "Started a local Ray instance"
"""Ray's log line as an embedded Ray starts."""


def entrypoint_command(spec_file: Path, tmp_path: Path) -> list[str]:
    """The RayJob's entrypoint as the operator renders it, on an embedded Ray (`--address ""`)."""
    command = [sys.executable, "-m", "kuberl.trainer.run", "--spec-file", str(spec_file), "--name", "faults"]
    return [*command, "--address", "", "--run-dir", str(tmp_path / "entry")]


def entrypoint(spec_file: Path, tmp_path: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        entrypoint_command(spec_file, tmp_path),
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for_checkpoint(folder: Path, proc: subprocess.Popen[str], timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sealed = ckpt.list_checkpoints(folder)
        if sealed:
            return sealed[0][1]
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.5)
    raise AssertionError(f"no checkpoint in {folder} after {timeout} s")


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_a_second_trainer_on_a_folder_in_use_exits_permanent_and_deletes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    spec_file = write(tmp_path / "job.yaml", job(folder))
    first = start_in_session(run_command(spec_file, tmp_path / "first"))
    try:
        wait_for_checkpoint(folder, first)
        second = entrypoint(spec_file, tmp_path, timeout=120)
        assert second.returncode == EXIT_PERMANENT, second.stderr[-3000:]
        holder = json.loads((folder / ckpt_folder.OWNER).read_text())
        assert f"is in use by run {holder['run_id']} of RLJob faults" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        assert "Started a local Ray instance" not in second.stderr  # refused before Ray and the models
        os.kill(first.pid, signal.SIGTERM)
        output, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 143, output[-3000:]
    sealed = ckpt.list_checkpoints(folder)
    assert sealed and all(ckpt.verify(path) is None for _, path in sealed)  # its checkpoints are whole
    assert not [path for _, path in ckpt.step_folders(folder) if not ckpt.is_complete(path)]


@pytest.mark.timeout(200)
def test_a_read_only_checkpoint_folder_exits_permanent_before_ray_starts(tmp_path: Path, small_filesystem: Any) -> None:
    root = small_filesystem("1m", read_only=True)
    proc = entrypoint(write(tmp_path / "job.yaml", job(root / "ckpt")), tmp_path, timeout=180)
    assert proc.returncode == EXIT_PERMANENT, proc.stderr[-3000:]
    assert f"CheckpointStorageError: trainer.checkpointDir {root / 'ckpt'} cannot be written: Read-only" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_a_disk_that_fills_during_the_run_exits_permanent_at_the_save(tmp_path: Path, small_filesystem: Any) -> None:
    root = small_filesystem("4m")
    folder = root / "ckpt"
    spec_file = write(tmp_path / "job.yaml", job(folder, maxCheckpoints=2))
    proc = start_in_session(entrypoint_command(spec_file, tmp_path))
    try:
        wait_for_checkpoint(folder, proc)
        try:  # another writer takes the rest of the volume, unless the trainer's next save already has
            with open(root / "filler", "wb") as filler:
                while True:
                    filler.write(bytes(1 << 16))
                    filler.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == EXIT_PERMANENT, output[-4000:]
    assert "error: CheckpointStorageError: saving the checkpoint of step" in output
    assert f"trainer.checkpointDir {folder} " in output and "storage.claim.size" in output


def run_to_files(spec_file: Path, run_dir: Path, logs: Path) -> tuple[int, str, str]:
    """`kuberl run` with its stdout and stderr in files, as in a pod or `> log 2>&1` (no --no-progress: the bar must
    stay out of a file by itself); returns the exit code, stdout and stderr."""
    command = [sys.executable, "-m", "kuberl.cli", "run", str(spec_file), "--run-dir", str(run_dir)]
    out, err = logs.with_suffix(".out"), logs.with_suffix(".err")
    with out.open("w") as stdout, err.open("w") as stderr:
        code = subprocess.run(command, cwd=REPO, env=cli_env(), stdout=stdout, stderr=stderr, timeout=400).returncode
    return code, out.read_text(), err.read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_finished_run_says_it_trained_nothing_a_changed_batch_is_refused_for_good_and_export_writes_a_card(
    tmp_path: Path,
) -> None:
    """One finished run, started again three ways: the last lines a user reads (steps trained, where the policy
    goes), a resume that has nothing left to train, a resume the changed batch refuses, and `kuberl export`."""
    folder, run_dir = tmp_path / "ckpt", tmp_path / "run"
    code, finished, err = run_to_files(write(tmp_path / "job.yaml", job(folder, totalSteps=2)), run_dir, tmp_path / "1")
    assert code == 0, err[-3000:]
    assert "\r" not in err and "step/s" not in err  # no tqdm bar in a file
    assert "run faults: 2 steps in" in finished and "now at step 2 of 2" in finished
    assert f"kuberl export {run_dir} hf/faults" in finished
    assert RAY_STARTED in err

    new_lr = job(folder, totalSteps=2)
    new_lr["spec"]["actor"] = {"optim": {"lr": 1e-3}}
    code, again, err = run_to_files(write(tmp_path / "lr.yaml", new_lr), run_dir, tmp_path / "2")
    assert code == 0, err[-3000:]
    assert "\r" not in err and "step/s" not in err
    assert "nothing to train: resumed at step 2, which is trainer.totalSteps (2)" in again
    assert RAY_STARTED not in err  # decided from the checkpoint before any worker starts

    batch = job(folder, totalSteps=4)
    batch["spec"]["batch"]["ppoMicroBatchSizePerGPU"] = 4
    refused = entrypoint(write(tmp_path / "batch.yaml", batch), tmp_path)
    assert refused.returncode == EXIT_PERMANENT, refused.stderr[-3000:]
    assert "error: CheckpointMismatch: trainer.checkpointDir" in refused.stderr
    assert "different spec.model/data/algorithm/batch" in refused.stderr
    assert RAY_STARTED not in refused.stderr  # refused before any worker loads a model
    assert refused.returncode != EXIT_STOPPED

    export = [sys.executable, "-m", "kuberl.cli", "export", str(run_dir), str(tmp_path / "hf")]
    result = subprocess.run(export, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    card = (tmp_path / "hf" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "# faults, step 2" in card and "| advantage estimator | grpo |" in card
