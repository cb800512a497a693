"""`kuberl plan` as a user runs it: the model's shape without its weights, the GPU from the spec or --gpu."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from kuberl.api import RLJobSpec
from kuberl.api.memory import GPU_PRODUCT_LABEL, config_shape
from kuberl.cli import main
from kuberl.trainer.model.shape import model_shape
from kuberl.trainer.plan.layout import ClusterFacts
from tests.api.cases import BASE
from tests.api.plan_cases import QWEN2_5_0_5B_SHAPE, too_large_rljob

TINY = "tiny://llama?hidden=64&layers=2&heads=4&kv_heads=2"
QWEN2_5_0_5B = {
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "tie_word_embeddings": True,
}


def _job(tmp_path: Path, **spec_edits: object) -> str:
    doc = copy.deepcopy(BASE)
    doc["spec"]["model"]["path"] = TINY
    doc["spec"].update(spec_edits)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_tiny_model_shape_has_no_weights_loaded() -> None:
    shape = model_shape(TINY)
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.intermediate) == (64, 2, 4, 2, 256)


def test_config_json_shape_counts_qwen2_5_0_5b() -> None:
    assert config_shape(QWEN2_5_0_5B).params == 494_032_768  # the published count


def test_hf_folder_config_is_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    assert model_shape(str(tmp_path)).layers == 24


def test_plan_json_with_gpu_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", _job(tmp_path), "--gpu", "H100-80GB", "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] is True and plan["gpu"] == "H100-80GB" and plan["largest_micro_batch"] == 8
    assert [r["name"] for r in plan["roles"]] == ["actor"]


def test_plan_reads_the_gpu_from_the_node_selector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = {"trainer": {"nodes": 1, "gpusPerNode": 8, "nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-L4"}}}
    assert main(["plan", _job(tmp_path, cluster=cluster)]) == 0
    assert "8 × L4" in capsys.readouterr().out


def test_plan_that_does_not_fit_exits_one_with_advice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    job = _job(tmp_path)
    assert main(["plan", job, "--gpu", "7GiB", "--set", f"model.path={tmp_path}"]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "batch.ppoMicroBatchSizePerGPU: 2 fits" in out


def test_plan_with_one_gpu_puts_a_separate_engine_on_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = {"trainer": {"nodes": 1, "gpusPerNode": 1}, "rollout": {"nodes": 1, "gpusPerNode": 1}}
    job = _job(tmp_path, cluster=cluster, rollout={"placement": "separate"})
    assert main(["plan", job, "--gpu", "H100-80GB", "--gpus", "1", "-o", "json"]) == 0
    shared = json.loads(capsys.readouterr().out)
    assert main(["plan", job, "--gpu", "H100-80GB", "-o", "json"]) == 0
    pools = json.loads(capsys.readouterr().out)
    assert (shared["layout"], pools["layout"]) == ("shared", "pools")
    assert shared["engine_on_trainer_gpu_gib"] > 0.5 * 79 and pools["rollout_gpu_gib"] > 0.5 * 79


def test_plan_without_a_gpu_says_how_to_name_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", _job(tmp_path)]) == 2
    assert "pass --gpu" in capsys.readouterr().err


def test_plan_of_an_unknown_model_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", _job(tmp_path), "--gpu", "H200", "--set", "model.path=/nowhere"]) == 2
    assert "'/nowhere': no model config found" in capsys.readouterr().err


def test_plan_takes_the_shape_from_model_shape_where_model_path_is_in_the_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "oom.yaml"
    path.write_text(yaml.safe_dump(too_large_rljob("oom")))  # model.path /model
    assert main(["plan", str(path)]) == 1  # the plan, not admission's refusal that quotes it
    out = capsys.readouterr().out
    assert out.startswith("RLJob oom on 1 × H100-80GB") and "does NOT fit" in out
    assert "model: 1,138.8 M parameters" in out


def _dynamic(tmp_path: Path, shape: dict[str, object] | None = None, **dynamic: object) -> RLJobSpec:
    from kuberl.api.validation import parse_spec

    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    spec = copy.deepcopy(BASE["spec"])
    spec["model"] = {"path": str(tmp_path), "gradientCheckpointing": False}
    if shape is not None:
        spec["model"]["shape"] = shape
    spec["cluster"] = {"trainer": {"nodes": 1, "gpusPerNode": 1}, "device": "cuda"}
    spec["batch"] = {"trainBatchSize": 64, "rolloutN": 4, "ppoMiniBatchSize": 64, "dynamicBatchSize": dynamic}
    return parse_spec(spec)


def test_the_run_takes_the_token_budget_its_plan_chooses_for_the_gpu(tmp_path: Path) -> None:
    from kuberl.api.memory import gpu_named, plan_memory
    from kuberl.trainer.plan.execution import plan_execution

    spec = _dynamic(tmp_path, enabled=True)
    chosen = plan_memory(spec, config_shape(QWEN2_5_0_5B), gpu_named("H100-80GB")).token_budget
    plan = plan_execution(spec, ClusterFacts(gpus=1, gpu=gpu_named("H100-80GB")))
    assert chosen is not None and plan.actor_update.max_tokens == plan.log_prob.max_tokens == chosen
    assert plan_execution(spec).actor_update.max_tokens == 16384  # no GPU known


def test_the_run_says_which_token_budget_its_plan_chose_when_the_spec_leaves_it_out(tmp_path: Path) -> None:
    from kuberl.api.memory import gpu_named
    from kuberl.trainer.plan.execution import plan_execution, token_budget_line

    h100 = gpu_named("H100-80GB")
    spec = _dynamic(tmp_path, enabled=True)
    fitted = plan_execution(spec, ClusterFacts(gpus=1, gpu=h100))
    assert token_budget_line(spec, fitted, h100) == (
        f"micro-batch token budget {fitted.actor_update.max_tokens}: the largest the memory plan fits on {h100.name} "
        "(batch.dynamicBatchSize.maxTokenLenPerGPU left out)"
    )
    assert token_budget_line(spec, plan_execution(spec), None) == (
        "micro-batch token budget 16384: the GPU is unknown, the default (batch.dynamicBatchSize.maxTokenLenPerGPU "
        "left out)"
    )
    chosen = _dynamic(tmp_path, enabled=True, maxTokenLenPerGPU=8192)
    assert token_budget_line(chosen, plan_execution(chosen, ClusterFacts(gpus=1, gpu=h100)), h100) is None


def test_a_run_whose_plan_does_not_fit_its_gpu_is_refused_with_the_plan(tmp_path: Path) -> None:
    from kuberl.api.memory import gpu_named
    from kuberl.trainer.plan.execution import plan_execution
    from kuberl.trainer.plan.layout import PlacementError

    spec = _dynamic(tmp_path, enabled=True, maxTokenLenPerGPU=262144)
    with pytest.raises(PlacementError, match=r"does not fit one H100-80GB .*maxTokenLenPerGPU: \d+ fits") as refused:
        plan_execution(spec, ClusterFacts(gpus=1, gpu=gpu_named("H100-80GB")))
    assert "phase: train" in str(refused.value)


def test_a_run_plans_with_the_models_config_where_model_shape_matches_it(tmp_path: Path) -> None:
    from kuberl.api.memory import gpu_named
    from kuberl.trainer.plan.execution import plan_execution

    declared = _dynamic(tmp_path, QWEN2_5_0_5B_SHAPE, enabled=True)
    undeclared = _dynamic(tmp_path, enabled=True)
    h100 = ClusterFacts(gpus=1, gpu=gpu_named("H100-80GB"))
    assert plan_execution(declared, h100) == plan_execution(undeclared, h100)


def test_a_model_shape_that_is_not_the_models_is_refused_naming_what_differs(tmp_path: Path) -> None:
    from kuberl.api.memory import gpu_named
    from kuberl.api.validation import InvalidSpec
    from kuberl.trainer.plan.execution import plan_execution

    spec = _dynamic(tmp_path, {**QWEN2_5_0_5B_SHAPE, "numHiddenLayers": 12, "attentionBias": False}, enabled=True)
    with pytest.raises(InvalidSpec, match=r"spec.model.shape: declares another shape") as refused:
        plan_execution(spec, ClusterFacts(gpus=1, gpu=gpu_named("H100-80GB")))
    assert "layers 12 (the model: 24), qkv_bias False (the model: True)" in str(refused.value)
