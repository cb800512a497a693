"""What the driver reports beside metrics.jsonl: the RLJob's status progress each step, and a damaged checkpoint that
resume skipped as a console warning plus a Warning Event on the RLJob."""

import os
from pathlib import Path

import yaml

from kuberl.api import parse_spec
from kuberl.trainer.checkpoint import files as ckpt
from kuberl.trainer.checkpoint.checkpointer import select_resume
from kuberl.trainer.checkpoint.folder import CheckpointFolder
from kuberl.trainer.observe.reporting import Reporting
from kuberl.trainer.observe.status import StatusReporter
from tests.trainer.test_checkpoint import seal
from tests.trainer.test_run_status_reporter import FakeApi, FakeCore

REPO = Path(__file__).resolve().parents[2]


def tiny_spec(checkpoint_dir: Path):
    spec = yaml.safe_load((REPO / "examples/tiny-cpu.yaml").read_text())["spec"]
    spec["trainer"].update(checkpointDir=str(checkpoint_dir), metricsPort=0, loggers=["jsonl"])
    spec["data"]["trainFiles"] = [str(REPO / f) for f in spec["data"]["trainFiles"]]
    return parse_spec(spec)


def reporting(tmp_path: Path, api: FakeApi, core: FakeCore | None = None) -> Reporting:
    out = Reporting(tiny_spec(tmp_path / "ckpt"), rljob="tiny", namespace="team", run_dir=tmp_path, total_steps=40)
    out.status = StatusReporter("tiny", "team", api=api, core=core)
    return out


def test_the_step_progress_carries_step_epoch_reward_checkpoint_and_token_rate(tmp_path):
    api = FakeApi()
    metrics = {
        "training/epoch": 1.0,
        "critic/score/mean": 0.25,
        "perf/total_num_tokens": 5760.0,
        "perf/time_per_step": 2.0,
    }
    reporting(tmp_path, api).progress(7, metrics, last_checkpoint="/ckpt/global_step_5", force=True)
    progress = api.calls[0][-1]["status"]["progress"]
    assert (progress["step"], progress["totalSteps"], progress["epoch"]) == (7, 40, 1)
    assert (progress["rewardMean"], progress["lastCheckpoint"]) == (0.25, "/ckpt/global_step_5")
    assert progress["tokensPerSecond"] == 2880.0
    assert "rolloutEngines" not in progress  # colocated: no separate engines to count


def test_the_step_progress_counts_the_separate_rollout_engines(tmp_path):
    api = FakeApi()
    metrics = {"perf/total_num_tokens": 10.0, "perf/time_per_step": 1.0, "rollout/engines": 3.0}
    reporting(tmp_path, api).progress(2, metrics, last_checkpoint=None, force=True)
    assert api.calls[0][-1]["status"]["progress"]["rolloutEngines"] == 3


def test_a_damaged_checkpoint_is_skipped_with_a_console_warning_and_an_event(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBERL_RLJOB_UID", "uid-1")
    spec = tiny_spec(tmp_path / "ckpt")
    folder = ckpt.prepare(spec.trainer.checkpoint_dir, 10)
    ckpt.write_atomic(folder / "actor" / "model" / "__0_0.distcp", lambda f: f.write(os.urandom(4096)))
    seal(folder, 10, ckpt.Identity("uid-1", ckpt.resume_fields_hash(spec)))
    ckpt.mark_latest(spec.trainer.checkpoint_dir, folder)
    with open(folder / "actor" / "model" / "__0_0.distcp", "r+b") as f:
        f.truncate(100)
    core = FakeCore()
    held = CheckpointFolder(spec, rljob="tiny")
    held.take()
    start = select_resume(spec, held, reporting(tmp_path, FakeApi(), core))
    assert start.folder is None and start.step == 0
    assert f"warning: checkpoint {folder} is damaged and was skipped" in capsys.readouterr().out
    ((_, event),) = core.events
    assert event["reason"] == "CheckpointDamaged" and "truncated" in event["message"]
