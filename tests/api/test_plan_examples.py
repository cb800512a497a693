"""`kuberl plan` on the shipped GPU examples: the GPU read from each pool's node selector (NVIDIA's GPU label,
GKE's accelerator label, an instance type; --gpu where it names none), the model's shape from --model where
model.path exists only in the pods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kuberl.cli import main

ROOT = Path(__file__).resolve().parents[2]
QWEN2_5 = {  # config.json's shape keys of the Qwen2.5 Instruct models the examples name
    "Qwen2.5-0.5B-Instruct": (896, 24, 14, 2, 4864, 151936, True),
    "Qwen2.5-1.5B-Instruct": (1536, 28, 12, 2, 8960, 151936, True),
    "Qwen2.5-7B-Instruct": (3584, 28, 28, 4, 18944, 152064, False),
}
EXAMPLES = {  # example → (its model, the GPU its trainer pool's node selector names, or None)
    "gsm8k-grpo.yaml": ("Qwen2.5-0.5B-Instruct", "H200"),  # cloud.google.com/gke-accelerator
    "gsm8k-ppo.yaml": ("Qwen2.5-1.5B-Instruct", "H100-80GB"),  # node.kubernetes.io/instance-type: p5.48xlarge
    "separate-rollout.yaml": ("Qwen2.5-7B-Instruct", None),  # pool: h200-train names no GPU: --gpu H200
    "async-rollout.yaml": ("Qwen2.5-7B-Instruct", None),  # pool: h200-train names no GPU: --gpu H200
}


def model_folder(tmp_path: Path, name: str) -> Path:
    hidden, layers, heads, kv_heads, intermediate, vocab, tie = QWEN2_5[name]
    folder = tmp_path / name
    folder.mkdir()
    config = {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "tie_word_embeddings": tie,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("example", EXAMPLES)
def test_plan_reads_the_gpu_from_the_example_and_the_shape_from_model(
    example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, gpu = EXAMPLES[example]
    args = ["plan", str(ROOT / "examples" / example), "--model", str(model_folder(tmp_path, model)), "-o", "json"]
    code = main([*args, *([] if gpu else ["--gpu", "H200"])])
    plan = json.loads(capsys.readouterr().out)
    assert code == (0 if plan["fits"] else 1)
    assert plan["gpu"] == (gpu or "H200") and plan["fits"] is True, plan


@pytest.mark.parametrize("example", EXAMPLES)
def test_a_model_path_only_in_the_pods_says_to_give_its_shape_with_model(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model, _ = EXAMPLES[example]
    assert main(["plan", str(ROOT / "examples" / example)]) == 2
    err = capsys.readouterr().err
    assert f"model.path /models/{model} is on the volume models of the pods, not on this machine" in err
    assert "--model" in err
