"""The memory plan's arithmetic against hand-worked numbers."""

from __future__ import annotations

import copy

import pytest

from kuberl.api.memory import GIB, ModelShape, activations_bytes, gpu_named, logits_bytes, plan_memory
from kuberl.api.validation import parse_spec
from tests.api.cases import BASE

# hidden 64, 4 heads of 16, 2 KV heads: per layer q/o 64·64 each, k/v 64·32 each, MLP 3·64·256, two norms.
TINY = ModelShape(vocab=100, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256)
TINY_PARAMS = 100 * 64 + 2 * (64 * 128 + 64 * 64 + 3 * 64 * 256 + 2 * 64) + 64


def _spec(**batch: object) -> object:
    doc = copy.deepcopy(BASE["spec"])
    doc["batch"].update(batch)
    return parse_spec(doc)


def test_parameter_count_of_a_tiny_llama() -> None:
    assert TINY.params == TINY_PARAMS == 129600


def test_parameter_count_of_smollm2_135m() -> None:
    smollm2 = ModelShape(vocab=49152, hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536)
    assert smollm2.params == 134_515_008  # the published count


def test_activations_with_and_without_checkpointing() -> None:
    tokens = 4 * 1024
    one_layer = tokens * (4 * 64 + 64 + 2 * 32 + 64 + 3 * 256) * 2  # 9 961 472 bytes
    assert activations_bytes(TINY, tokens, 2, checkpointing=False) == 2 * one_layer
    assert activations_bytes(TINY, tokens, 2, checkpointing=True) == 2 * tokens * 64 * 2 + one_layer


def test_logits_are_response_tokens_only() -> None:
    assert logits_bytes(TINY, rows=4, response_tokens=512, dtype_bytes=2) == 2 * 4 * 512 * 100 * 2 + 512 * 100 * 4


def test_fsdp_shards_params_grads_and_adam_over_the_trainer_gpus() -> None:
    plan = plan_memory(_spec(), TINY, gpu_named("H200"))  # BASE: 8 GPUs, KL off, no critic
    (actor,) = plan.roles
    assert actor.params == pytest.approx(4 * TINY_PARAMS / 8 / GIB)
    assert actor.grads == pytest.approx(4 * TINY_PARAMS / 8 / GIB)
    assert actor.optimizer == pytest.approx(8 * TINY_PARAMS / 8 / GIB)


def test_optimizer_offload_keeps_adam_off_the_gpu_between_steps() -> None:
    spec = parse_spec({**copy.deepcopy(BASE["spec"]), "actor": {"fsdp": {"optimizerOffload": True}}})
    (actor,) = plan_memory(spec, TINY, gpu_named("H200")).roles
    assert actor.optimizer == 0 and actor.optimizer_step == pytest.approx(8 * TINY_PARAMS / 8 / GIB)


def test_kl_adds_a_reference_copy_and_gae_a_critic() -> None:
    doc = copy.deepcopy(BASE["spec"])
    doc["algorithm"] = {"advantageEstimator": "gae", "kl": {"loss": {"enabled": True}}}
    doc["critic"] = {}
    roles = {r.name: r for r in plan_memory(parse_spec(doc), TINY, gpu_named("H200")).roles}
    assert roles["reference"].params == pytest.approx(4 * TINY_PARAMS / 8 / GIB) and roles["reference"].grads == 0
    assert roles["critic"].params == pytest.approx(4 * (TINY_PARAMS + 64) / 8 / GIB)


def test_kv_cache_is_what_gpu_memory_utilization_leaves_after_weights_and_activations() -> None:
    plan = plan_memory(_spec(), TINY, gpu_named("80GiB"))
    assert plan.vllm_weights_gib == pytest.approx(TINY_PARAMS * 2 / GIB)
    assert plan.vllm_kv_cache_gib == pytest.approx(0.5 * 80 - plan.vllm_weights_gib - plan.vllm_activations_gib)
    assert plan.vllm_kv_tokens == int(plan.vllm_kv_cache_gib * GIB // (2 * 2 * 2 * 16 * 2))


def test_colocated_peak_is_the_larger_phase() -> None:
    plan = plan_memory(_spec(), TINY, gpu_named("80GiB"))
    resident = sum(r.resident for r in plan.roles)
    assert plan.generate_phase_gib == pytest.approx(resident + 40)
    assert plan.peak_gib == max(plan.generate_phase_gib, plan.train_phase_gib)


def test_too_small_a_gpu_does_not_fit_and_names_a_micro_batch_that_does() -> None:
    big = ModelShape(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, qkv_bias=True)
    spec = _spec(ppoMicroBatchSizePerGPU=8)  # 8 rows per GPU per mini-batch at 1024 tokens
    plan = plan_memory(spec, big, gpu_named("4GiB"))
    assert not plan.fits
    assert plan.largest_micro_batch is not None and plan.largest_micro_batch < 8
    assert any(f"batch.ppoMicroBatchSizePerGPU: {plan.largest_micro_batch} fits" in a for a in plan.advice)


def test_gpu_names_from_node_labels() -> None:
    assert gpu_named("NVIDIA-H100-80GB-HBM3").name == "H100-80GB"
    assert gpu_named("NVIDIA-A100-SXM4-40GB").name == "A100-40GB"
    assert gpu_named("NVIDIA-H200").total_gib == pytest.approx(143771 / 1024)
    with pytest.raises(ValueError, match="unknown GPU 'TPU'"):
        gpu_named("TPU")
