"""What a `kuberl run` leaves a user with: a last line that counts the steps this run trained (none when it resumed
at totalSteps) and says how to export the policy, no progress bar in a log file, and `kuberl export` writing a
model card beside the weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuberl.trainer.run import run_summary
from tests.trainer.kuberl_cli import REPO, cli_env


def test_a_run_that_trained_counts_its_own_steps_and_points_at_export() -> None:
    text = run_summary("tiny", Path("runs/tiny"), 10, 40, 40, 12.34, "ck/global_step_40")
    assert text.splitlines() == [
        "run tiny: 30 steps (resumed at step 10) in 12.3 s, now at step 40 of 40; metrics in runs/tiny/metrics.jsonl",
        "last checkpoint ck/global_step_40 (trainer state); the policy as a Hugging Face folder: "
        "kuberl export runs/tiny hf/tiny",
    ]


def test_a_resumed_run_that_trains_nothing_says_so() -> None:
    text = run_summary("tiny", Path("runs/tiny"), 40, 40, 40, 15.5, "ck/global_step_40")
    assert "40 steps" not in text
    assert "nothing to train: resumed at step 40, which is trainer.totalSteps (40)" in text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_twice_then_export(tmp_path: Path) -> None:
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["trainer"].update(checkpointDir=str(tmp_path / "ckpt"), metricsPort=0, totalSteps=2, testFreq=-1)
    doc["spec"]["trainer"]["valBeforeTrain"] = False
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    run = [sys.executable, "-m", "kuberl.cli", "run", str(spec_file), "--run-dir", str(tmp_path / "run")]
    outputs = []
    for attempt in range(2):  # stdout and stderr to files, as in a pod or `> log 2>&1`
        out, err = tmp_path / f"out{attempt}", tmp_path / f"err{attempt}"
        with out.open("w") as stdout, err.open("w") as stderr:
            code = subprocess.run(run, cwd=REPO, env=cli_env(), stdout=stdout, stderr=stderr, timeout=400).returncode
        assert code == 0, err.read_text()[-3000:]
        assert "\r" not in err.read_text() and "step/s" not in err.read_text()  # no tqdm bar in a file
        outputs.append(out.read_text())
    assert "run tiny-cpu: 2 steps in" in outputs[0] and f"kuberl export {tmp_path / 'run'} hf/tiny-cpu" in outputs[0]
    assert "nothing to train: resumed at step 2, which is trainer.totalSteps (2)" in outputs[1]
    export = [sys.executable, "-m", "kuberl.cli", "export", str(tmp_path / "run"), str(tmp_path / "hf")]
    result = subprocess.run(export, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    card = (tmp_path / "hf" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "# tiny-cpu, step 2" in card and "| advantage estimator | grpo |" in card
