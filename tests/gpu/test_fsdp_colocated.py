"""The colocated arrangement in one process: an FSDP2 actor (torch.distributed initialised, as in a worker) and a
vLLM engine that joins its process group, sleeps while the actor trains and receives the new weights in buckets."""

from __future__ import annotations

import os

import pytest
import torch

from tests.gpu.conftest import MODEL

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

TEXT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? #### 72"
)


@pytest.fixture(scope="module")
def process_group():
    import torch.distributed as dist

    from kuberl.trainer.rollout.weight_sync import free_port

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    if dist.is_initialized():  # the engine's shutdown destroys the group it joined
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def folder() -> str:
    from kuberl.trainer.rollout.vllm import model_folder

    return model_folder(MODEL)


@pytest.fixture(scope="module")
def actor(process_group, folder: str):
    from transformers import AutoModelForCausalLM

    from kuberl.trainer.model import fsdp

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return fsdp.prepare(
        model,
        device=torch.device("cuda", 0),
        dtype="bfloat16",
        gradient_checkpointing=False,
        reshard_after_forward=True,
        param_offload=False,
    )


@pytest.fixture(scope="module")
def engine(actor, folder: str):
    from kuberl.trainer.model.loading import load_tokenizer
    from kuberl.trainer.rollout.vllm import VLLMRollout

    tokenizer = load_tokenizer(folder)
    rollout = VLLMRollout(
        folder,
        pad_id=tokenizer.pad_token_id,
        eos_ids=[tokenizer.eos_token_id],
        gpu_memory_utilization=0.2,
        max_model_len=1024,
        enforce_eager=True,
        load_format="dummy",
        bucket_mb=32,
    )
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def ids(folder: str) -> list[int]:
    from kuberl.trainer.model.loading import load_tokenizer

    return load_tokenizer(folder)(TEXT)["input_ids"]


def bf16_floor(folder: str, actor, ids: list[int]) -> float:
    """Mean |bf16 − fp32| of the actor's log-probs at its current weights: the scale of the tolerance.

    bf16's error grows with the logits, so the floor is measured on the weights being compared, not once.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from kuberl.trainer.model import fsdp

    reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32)
    loaded = reference.load_state_dict({name: t.float() for name, t in fsdp.full_named_parameters(actor)}, strict=False)
    assert set(loaded.missing_keys) <= {"lm_head.weight"} and not loaded.unexpected_keys, loaded
    reference.tie_weights()
    value = (actor_log_probs(actor, ids) - actor_log_probs(reference.cuda().eval(), ids)).abs().mean().item()
    del reference
    torch.cuda.empty_cache()
    return value


@pytest.fixture(scope="module")
def floor(folder: str, actor, ids: list[int]) -> float:
    """The floor before any training step."""
    return bf16_floor(folder, actor, ids)


def tolerance(floor: float) -> float:
    return max(3 * floor, 0.02)


def vllm_log_probs(engine, ids: list[int]) -> torch.Tensor:
    from vllm import SamplingParams, TokensPrompt

    out = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=ids)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )[0]
    return torch.as_tensor([out.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i > 0])


def actor_log_probs(actor, ids: list[int]) -> torch.Tensor:
    x = torch.as_tensor([ids], device="cuda")
    with torch.no_grad():
        logits = actor(input_ids=x).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].cpu()


def sync(engine, actor) -> None:
    from kuberl.trainer.model import fsdp

    engine.update_weights(fsdp.full_named_parameters(actor))
    engine.wake()


def test_engine_joins_the_trainer_process_group_via_external_launcher(engine) -> None:
    config = engine.llm.llm_engine.vllm_config.parallel_config
    assert config.distributed_executor_backend == "external_launcher"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_fsdp_weights_streamed_into_a_dummy_engine_reproduce_the_actor(engine, actor, ids, floor, record) -> None:
    sync(engine, actor)
    diff = (vllm_log_probs(engine, ids) - actor_log_probs(actor, ids)).abs()
    record.update(
        {
            "fsdp_sync_logprob_abs_diff_mean": round(diff.mean().item(), 5),
            "fsdp_sync_logprob_abs_diff_max": round(diff.max().item(), 5),
            "actor_bf16_vs_fp32_logprob_abs_diff_mean": round(floor, 5),
        }
    )
    assert diff.mean() < tolerance(floor)


def test_sleep_train_step_sync_wake_cycle_tracks_the_updated_actor(engine, actor, folder, ids, record) -> None:
    from kuberl.trainer.rollout.vllm import gpu_memory_in_use_gib

    sync(engine, actor)
    before = vllm_log_probs(engine, ids)
    awake = gpu_memory_in_use_gib()
    engine.sleep()
    asleep = gpu_memory_in_use_gib()
    # one optimizer step that visibly moves the engine's log-probs without wrecking the model: with lr 0.5 the
    # log-probs moved by ~43 nats per token, where bf16's own error alone exceeds a tolerance measured before it
    optimizer = torch.optim.SGD(actor.parameters(), lr=0.05)
    x = torch.as_tensor([ids], device="cuda")
    loss = actor(input_ids=x, labels=x).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(engine, actor)
    after = vllm_log_probs(engine, ids)
    diff = (after - actor_log_probs(actor, ids)).abs()
    moved = (after - before).abs().mean().item()
    floor_after = bf16_floor(folder, actor, ids)
    record.update(
        {
            "colocated_gib_awake": round(awake, 3),
            "colocated_gib_asleep": round(asleep, 3),
            "after_step_logprob_abs_diff_mean": round(diff.mean().item(), 5),
            "after_step_bf16_vs_fp32_logprob_abs_diff_mean": round(floor_after, 5),
            "train_step_logprob_abs_change_mean": round(moved, 5),
        }
    )
    assert asleep < awake - 1.0
    assert diff.mean() < tolerance(floor_after)
    assert moved > 10 * diff.mean(), "the engine did not pick up the trained weights"
