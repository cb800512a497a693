"""The memory plan's arithmetic against hand-worked numbers (tests/bench/test_plan_measured.py checks it against the
measured peaks)."""

from __future__ import annotations

import copy

import pytest

from kuberl.api import memory
from kuberl.api.memory import GIB, ModelShape, activations_bytes, format_plan, gpu_named, head_bytes, plan_memory
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


def test_the_head_holds_one_chunk_of_float32_logits_of_response_tokens() -> None:
    assert head_bytes(TINY, response_tokens=10_000, compiled=True) == 1.65 * 4096 * 100 * 4
    assert head_bytes(TINY, response_tokens=10_000, compiled=False) == 4.15 * 1024 * 100 * 4
    assert head_bytes(TINY, response_tokens=300, compiled=True) == 1.65 * 300 * 100 * 4


def test_eager_layers_keep_their_float32_norm_tensors_beside_the_counted_ones() -> None:
    tokens = 4 * 1024
    counted = activations_bytes(TINY, tokens, 2, checkpointing=False)
    assert memory.saved_activations_bytes(TINY, tokens, 2, False, compiled=True) == 1.05 * counted
    eager = memory.saved_activations_bytes(TINY, tokens, 2, False, compiled=False)
    assert eager == 1.05 * counted + 2 * 9.2 * 64 * tokens * 2


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


def test_colocated_phases_count_the_process_the_state_and_the_engine() -> None:
    plan = plan_memory(_spec(), TINY, gpu_named("80GiB"))
    resident = sum(r.resident for r in plan.roles)
    process = memory.PROCESS_GIB + memory.NCCL_GIB + memory.ENGINE_GIB  # 8 trainer GPUs; the engine in-process
    assert plan.layout == "colocated" and plan.process_gib == pytest.approx(process)
    assert plan.phases_gib["generate"] == pytest.approx(process + resident + 40)
    bucket = TINY_PARAMS * 2 / GIB
    assert plan.phases_gib["sync"] == pytest.approx(process + resident + plan.vllm_weights_gib + 2 * bucket)
    assert plan.phases_gib["train"] == pytest.approx(process + plan.train_allocated_gib + plan.allocator_reserve_gib)
    assert plan.peak_gib == max(plan.phases_gib.values())


def test_the_allocator_reserve_is_a_share_of_what_a_micro_batch_frees() -> None:
    plan = plan_memory(_spec(), TINY, gpu_named("80GiB"))
    assert plan.allocator_reserve_gib == pytest.approx(1.15 * (plan.activations_gib + plan.head_gib))


def _separate(share: float = 0.25, trainer_gpus: int | None = None) -> object:
    doc = copy.deepcopy(BASE["spec"])
    doc["rollout"] = {"placement": "separate", "gpuMemoryUtilization": share}
    doc["cluster"]["rollout"] = {"nodes": 1, "gpusPerNode": 8}
    if trainer_gpus is not None:
        doc["cluster"]["trainer"] = {"nodes": 1, "gpusPerNode": trainer_gpus}
    return parse_spec(doc)


def test_an_engine_on_the_trainers_gpu_is_counted_in_every_phase() -> None:
    own = plan_memory(_separate(), TINY, gpu_named("80GiB"), layout="disjoint")
    shared = plan_memory(_separate(), TINY, gpu_named("80GiB"), layout="shared")
    engine = 0.25 * 80 + memory.PROCESS_GIB + memory.ENGINE_GIB
    assert shared.engine_on_trainer_gpu_gib == pytest.approx(engine) and own.engine_on_trainer_gpu_gib == 0
    for phase in ("train", "sync"):
        assert shared.phases_gib[phase] == pytest.approx(own.phases_gib[phase] + engine)
    assert own.rollout_gpu_gib == pytest.approx(engine) and shared.rollout_gpu_gib is None
    assert "generate" not in own.phases_gib


def test_one_trainer_gpu_counts_nccls_buffers_only_where_it_broadcasts_the_weights_to_other_gpus() -> None:
    spec = _separate(trainer_gpus=1)
    shared = plan_memory(spec, TINY, gpu_named("80GiB"), layout="shared")  # CUDA IPC on the card
    for layout in ("pools", "disjoint"):
        own = plan_memory(spec, TINY, gpu_named("80GiB"), layout=layout)
        assert own.process_gib == pytest.approx(memory.PROCESS_GIB + memory.NCCL_GIB)
    assert shared.process_gib == pytest.approx(memory.PROCESS_GIB)


QWEN2 = ModelShape(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, qkv_bias=True)


def _one_gpu_budget(tokens: int | None) -> object:
    """One GPU, no checkpointing, 256 rows per mini-batch: the budget is bounded by memory, not by the rows."""
    doc = copy.deepcopy(BASE["spec"])
    doc["model"]["gradientCheckpointing"] = False
    doc["cluster"]["trainer"]["gpusPerNode"] = 1
    doc["batch"] = {"trainBatchSize": 64, "rolloutN": 4, "ppoMiniBatchSize": 64, "dynamicBatchSize": {"enabled": True}}
    if tokens is not None:
        doc["batch"]["dynamicBatchSize"]["maxTokenLenPerGPU"] = tokens
    return parse_spec(doc)


def test_a_left_out_token_budget_is_the_largest_under_ninety_percent_of_the_card() -> None:
    plan = plan_memory(_one_gpu_budget(None), QWEN2, gpu_named("40GiB"))
    assert plan.token_budget_chosen and plan.token_budget is not None and plan.token_budget % 1024 == 0
    assert plan.peak_gib <= 0.9 * 40
    assert plan_memory(_one_gpu_budget(plan.token_budget + 1024), QWEN2, gpu_named("40GiB")).peak_gib > 0.9 * 40
    assert plan.largest_token_budget is not None and plan.largest_token_budget > plan.token_budget


def test_a_budget_that_does_not_fit_gets_the_one_that_does() -> None:
    plan = plan_memory(_one_gpu_budget(65536), QWEN2, gpu_named("40GiB"))
    assert not plan.fits and plan.largest_token_budget is not None
    fix = f"batch.dynamicBatchSize.maxTokenLenPerGPU: {plan.largest_token_budget} fits"
    assert any(fix in line for line in plan.advice), plan.advice
    assert plan_memory(_one_gpu_budget(plan.largest_token_budget), QWEN2, gpu_named("40GiB")).fits


def test_too_large_an_engine_share_gets_a_share_that_fits() -> None:
    plan = plan_memory(_separate(0.95), TINY, gpu_named("20GiB"), layout="shared")
    assert not plan.fits
    (line,) = [a for a in plan.advice if a.startswith("rollout.gpuMemoryUtilization")]
    share = float(line.split(": ")[1].split()[0])
    assert share < 0.95 and plan_memory(_separate(share), TINY, gpu_named("20GiB"), layout="shared").fits


@pytest.mark.parametrize("gib", [2, 4, 8, 16, 80])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_plan_that_fits_never_says_nothing_fits(gib: int, dynamic: bool) -> None:
    batch: dict[str, object] = (
        {"ppoMicroBatchSizePerGPU": None, "dynamicBatchSize": {"enabled": True}} if dynamic else {}
    )
    plan = plan_memory(_spec(**batch), QWEN2, gpu_named(f"{gib}GiB"))
    text = format_plan("job", plan)
    if plan.fits:
        assert "fits" in text.splitlines()[0] and "none" not in text and not plan.advice
    else:
        assert "does NOT fit" in text and plan.advice


def test_too_small_a_gpu_does_not_fit_and_names_a_micro_batch_that_does() -> None:
    big = ModelShape(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, qkv_bias=True)
    spec = _spec(ppoMicroBatchSizePerGPU=8)  # 8 rows per GPU per mini-batch at 1024 tokens
    plan = plan_memory(spec, big, gpu_named("8GiB"))
    assert not plan.fits
    assert plan.largest_micro_batch is not None and plan.largest_micro_batch < 8
    assert any(f"batch.ppoMicroBatchSizePerGPU: {plan.largest_micro_batch} fits" in a for a in plan.advice)


def test_gpu_names_from_node_labels() -> None:
    assert gpu_named("NVIDIA-H100-80GB-HBM3").name == "H100-80GB"
    assert gpu_named("NVIDIA-A100-SXM4-40GB").name == "A100-40GB"
    assert gpu_named("NVIDIA-H200").total_gib == pytest.approx(143771 / 1024)
    with pytest.raises(ValueError, match="unknown GPU 'TPU'"):
        gpu_named("TPU")
