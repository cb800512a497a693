"""Admission's memory verdict (kuberl.api.memory_admission) as `kuberl validate` gives it: a job whose plan does not
fit the GPU its trainer pool's node selector names is refused with the plan `kuberl plan` prints; a job that fits, or
whose GPU or model shape admission cannot know, is admitted."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api.documents import check, load_rljob
from kuberl.api.memory import config_shape, does_not_fit, gpu_named, plan_memory
from kuberl.api.memory_admission import PLAN_FITS_RULE, admission_plan
from kuberl.api.validation import parse_spec
from kuberl.cli import main
from tests.api.plan_cases import (
    COLOCATED_UTILIZATIONS,
    LLAMA_11B_SHAPE,
    ONE_STEP_OFF_OOM_UTILIZATIONS,
    QWEN2_5_0_5B_SHAPE,
    fitting_rljob,
    on_h100,
    oom_rljob,
    too_large_rljob,
    too_large_spec,
)


@pytest.mark.parametrize("utilization", COLOCATED_UTILIZATIONS)
def test_a_colocated_run_too_large_for_an_h100_is_refused_with_the_plan(utilization: float) -> None:
    doc = too_large_rljob("oom", utilization=utilization)
    (issue,) = check("oom.yaml", doc).issues
    expected = plan_memory(parse_spec(doc["spec"]), config_shape(LLAMA_11B_SHAPE.model_dump()), gpu_named("H100-80GB"))
    assert issue.rule == PLAN_FITS_RULE and issue.message == does_not_fit("", expected)
    assert issue.message.startswith("RLJob does not fit one H100-80GB (") and "of 79.7 GiB at its peak" in issue.message
    assert "batch.dynamicBatchSize.maxTokenLenPerGPU: 35840 fits" in issue.message
    assert "model.gradientCheckpointing: true saves" in issue.message
    assert "largest token budget that fits: 35840" in issue.message


@pytest.mark.parametrize("utilization", ONE_STEP_OFF_OOM_UTILIZATIONS)
def test_the_one_step_off_runs_fit_a_cluster_where_the_engine_has_gpus_of_its_own(utilization: float) -> None:
    """They died with the engine on the trainer's card (tests/bench/test_plan_measured.py refuses them there); on a
    cluster the rollout pool has GPUs of its own, and the trainer alone at 32,768 tokens fits its card."""
    doc = oom_rljob("oom", separate=True, utilization=utilization)
    plan = admission_plan(parse_spec(doc["spec"]))
    assert plan is not None and plan.layout == "pools" and plan.engine_on_trainer_gpu_gib == 0.0
    assert plan.fits and plan.peak_gib < plan.gpu_gib and plan.token_budget == 32768
    assert check("oom.yaml", doc).issues == []


@pytest.mark.parametrize("separate", [False, True], ids=["colocated", "one-step-off"])
def test_the_same_runs_with_the_budget_left_out_are_admitted(separate: bool) -> None:
    doc = fitting_rljob("fits", separate=separate)
    assert check("fits.yaml", doc).issues == []
    plan = admission_plan(parse_spec(doc["spec"]))
    assert plan is not None and plan.fits and plan.token_budget_chosen


@pytest.mark.parametrize(
    "selector",
    [
        {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    ],
    ids=["gke-accelerator", "instance-type"],
)
def test_every_label_kuberl_plan_reads_names_the_gpu(selector: dict[str, str]) -> None:
    doc = on_h100("oom", too_large_spec(), selector)
    (issue,) = check("oom.yaml", doc).issues
    assert issue.rule == PLAN_FITS_RULE and "does not fit one H100-80GB" in issue.message


def test_a_larger_card_admits_the_same_job() -> None:
    doc = on_h100("big", too_large_spec(), {"nvidia.com/gpu.product": "NVIDIA-H200"})
    plan = admission_plan(parse_spec(doc["spec"]))
    assert plan is not None and plan.fits and check("big.yaml", doc).issues == []


@pytest.mark.parametrize(
    "selector",
    [{}, {"nvidia.com/gpu.product": "NVIDIA-B300-SXM6-AC"}, {"node.kubernetes.io/instance-type": "m7i.48xlarge"}],
    ids=["no-selector", "a-gpu-the-plan-has-no-size-for", "an-instance-type-of-no-known-gpu"],
)
def test_a_job_on_an_unknown_gpu_is_admitted(selector: dict[str, str]) -> None:
    doc = on_h100("oom", too_large_spec(), selector)
    assert admission_plan(parse_spec(doc["spec"])) is None
    assert check("oom.yaml", doc).issues == []


def test_a_job_without_model_shape_is_admitted() -> None:
    doc = too_large_rljob("oom")
    del doc["spec"]["model"]["shape"]
    assert admission_plan(parse_spec(doc["spec"])) is None
    assert check("oom.yaml", doc).issues == []


def test_model_shape_in_config_json_keys_counts_qwen2_5_0_5b() -> None:
    doc = too_large_rljob("qwen")
    doc["spec"]["model"]["shape"] = QWEN2_5_0_5B_SHAPE
    declared = parse_spec(doc["spec"]).model.shape
    assert declared is not None
    assert config_shape(declared.model_dump()).params == 494_032_768  # Qwen2.5-0.5B's published count


def test_an_unknown_model_shape_key_is_refused_naming_it() -> None:
    doc = too_large_rljob("oom")
    doc["spec"]["model"]["shape"]["numLayers"] = 22
    issues = check("oom.yaml", doc).issues
    assert [i.field for i in issues] == ["spec.model.shape.numLayers"]


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kuberl_validate_refuses_it_with_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(_write(tmp_path, too_large_rljob("oom", utilization=0.3)))]) == 1
    out = capsys.readouterr().out
    assert "RLJob oom is invalid (1 issue)" in out
    assert "spec: RLJob does not fit one H100-80GB" in out and f"[{PLAN_FITS_RULE}]" in out
    assert "phase: train" in out and "maxTokenLenPerGPU: 35840 fits" in out
    assert main(["validate", str(_write(tmp_path, fitting_rljob("fits", separate=True)))]) == 0


def test_kuberl_run_on_one_machine_leaves_the_verdict_to_the_trainer(tmp_path: Path) -> None:
    path = _write(tmp_path, too_large_rljob("oom"))
    with pytest.raises(ValueError, match="does not fit one H100-80GB"):
        load_rljob(path)
    assert load_rljob(path, one_machine=True)[0] == "oom"


def test_a_cpu_job_is_never_planned() -> None:
    doc = copy.deepcopy(too_large_rljob("cpu"))
    doc["spec"]["cluster"]["device"] = "cpu"
    doc["spec"]["rollout"]["engine"] = "hf"
    assert admission_plan(parse_spec(doc["spec"])) is None
