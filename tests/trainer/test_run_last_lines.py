"""What a `kuberl run` leaves a user with: a last line that counts the steps this run trained (none when it resumed
at totalSteps) and says how to export the policy. The same lines from real runs, no progress bar in a log file and
`kuberl export`'s model card are checked on the one finished run of tests/trainer/test_run_checkpoint_faults.py, which
starts it again and exports it."""

from __future__ import annotations

from pathlib import Path

from kuberl.trainer.run import run_summary


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
