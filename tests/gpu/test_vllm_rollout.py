"""VLLMRollout on one GPU, colocated-style (engine in this process): sampling, sleep/wake, weight updates, log-probs."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import MODEL

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

QUESTIONS = [
    "What is 7 times 8?",
    "Name a colour of the sky.",
    "Write one word that rhymes with cat.",
    "Ana has 3 apples and buys 4 more. How many apples does she have?",
]


@pytest.fixture(scope="module")
def folder() -> str:
    from kuberl.trainer.rollout.vllm import model_folder

    return model_folder(MODEL)


@pytest.fixture(scope="module")
def tokenizer(folder: str):
    from kuberl.trainer.model.loading import load_tokenizer

    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def eos_ids(tokenizer, folder: str) -> list[int]:
    from transformers import AutoConfig

    config_eos = AutoConfig.from_pretrained(folder).eos_token_id
    extra = config_eos if isinstance(config_eos, list) else [config_eos]
    return sorted({tokenizer.eos_token_id, *extra} - {None})


@pytest.fixture(scope="module")
def engine(folder: str, tokenizer, eos_ids: list[int]):
    from kuberl.trainer.rollout.vllm import VLLMRollout

    rollout = VLLMRollout(
        folder,
        pad_id=tokenizer.pad_token_id,
        eos_ids=eos_ids,
        gpu_memory_utilization=0.25,
        max_model_len=1024,
        enforce_eager=True,
        calculate_log_probs=True,
        bucket_mb=64,
    )
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def hf_model(folder: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()


@pytest.fixture(scope="module")
def hf_model32(folder: str):
    """The fp32 reference: |bf16 − fp32| is the rounding noise any bf16 engine carries (the tolerance's scale)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()


def tolerance(floor: torch.Tensor) -> float:
    """vLLM (bf16, other kernels) may differ from transformers-bf16 by a few times bf16's own rounding noise."""
    return max(3 * floor.mean().item(), 0.02)


def sequence_log_probs(model, prompt: list[int], response: list[int], temperature: float = 1.0) -> torch.Tensor:
    """transformers' log-probs of ``response`` given ``prompt`` (one unpadded sequence)."""
    ids = torch.as_tensor([prompt + response], device="cuda")
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(response, device="cuda")[:, None])[:, 0].cpu()


def greedy(engine, prompts: list[list[int]]) -> torch.Tensor:
    return engine.generate(prompts, 1, temperature=0.0, max_new_tokens=32).responses


def test_generate_returns_n_samples_per_prompt_with_masks_and_log_probs(engine, prompts, eos_ids, record) -> None:
    batch = engine.generate(prompts, 4, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=48)
    assert len(batch) == 4 * len(prompts)
    for i, prompt in enumerate(prompts):
        for j in range(4):
            row = batch.prompts[i * 4 + j][batch.prompt_mask[i * 4 + j].bool()].tolist()
            assert row == prompt
    lengths = batch.response_mask.sum(-1)
    assert lengths.min() >= 1 and lengths.max() <= 48
    assert batch.log_probs is not None
    assert (batch.log_probs[batch.response_mask.bool()] <= 0).all()
    assert (batch.log_probs[~batch.response_mask.bool()] == 0).all()
    assert (batch.responses[~batch.response_mask.bool()] == engine.pad_id).all()
    # samples of one prompt differ at temperature 1
    assert len({tuple(r.tolist()) for r in batch.responses[:4]}) > 1
    ended = [row[m.bool()][-1].item() in eos_ids for row, m in zip(batch.responses, batch.response_mask, strict=True)]
    record["generate_n4_rows"] = len(batch)
    record["generate_n4_rows_ending_in_eos"] = sum(ended)


def test_greedy_with_n_repeats_each_prompt(engine, prompts) -> None:
    batch = engine.generate(prompts[:2], 3, temperature=0.0, max_new_tokens=24)
    assert len(batch) == 6
    assert torch.equal(batch.responses[0], batch.responses[1]) and torch.equal(batch.responses[1], batch.responses[2])


def test_level2_sleep_releases_memory_and_reloaded_weights_give_identical_greedy_output(
    engine, hf_model, prompts, record
) -> None:
    import time

    before = greedy(engine, prompts)
    from kuberl.trainer.rollout.vllm import gpu_memory_in_use_gib

    torch.cuda.synchronize()

    awake = gpu_memory_in_use_gib()
    start = time.perf_counter()
    engine.sleep()
    slept_s = time.perf_counter() - start
    asleep = gpu_memory_in_use_gib()
    # the pool's memory is released, its allocations stay in PyTorch's counters (perf/engine_pool_gb says how much)
    pool_gib = engine.pool_bytes / 2**30
    assert pool_gib > 0.5 * 0.25 * torch.cuda.mem_get_info()[1] / 2**30
    assert torch.cuda.memory_reserved() / 2**30 >= pool_gib
    with pytest.raises(RuntimeError, match="update_weights"):
        engine.generate(prompts, 1, temperature=0.0, max_new_tokens=4)
    state = hf_model.state_dict()
    assert "lm_head.weight" in state or not engine.tied  # the tied head is sent and must be skipped
    start = time.perf_counter()
    engine.update_weights(state.items())
    loaded_s = time.perf_counter() - start
    start = time.perf_counter()
    engine.wake()
    woke_s = time.perf_counter() - start
    after = greedy(engine, prompts)
    assert torch.equal(before, after)
    engine_memory = awake - asleep
    record.update(
        {
            "gib_in_use_awake": round(awake, 3),
            "gib_in_use_asleep_level2": round(asleep, 3),
            "gib_released_by_sleep": round(engine_memory, 3),
            "engine_pool_gib_asleep": round(pool_gib, 3),
            "sleep_s": round(slept_s, 3),
            "wake_weights_and_load_s": round(loaded_s, 3),
            "wake_kv_cache_s": round(woke_s, 3),
            "hf_model_gib": round(sum(t.numel() * t.element_size() for t in state.values()) / 2**30, 3),
        }
    )
    # what stays is the CUDA context, the HF reference model of this test and allocator slack
    assert engine_memory > 0.5 * 0.25 * torch.cuda.mem_get_info()[1] / 2**30


def test_rollout_log_probs_match_transformers_after_a_weight_update(
    engine, hf_model, hf_model32, prompts, record
) -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    base = {k: v.clone() for k, v in hf_model.state_dict().items()}
    perturbed = {
        k: v
        + 0.05
        * v.float().std()
        * torch.randn(v.shape, generator=generator, device="cuda", dtype=torch.float32).to(v.dtype)
        if v.is_floating_point() and v.dim() >= 2
        else v
        for k, v in base.items()
    }
    if engine.tied:  # one tensor under two names: perturb it once (the engine skips lm_head.weight)
        perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]
    engine.update_weights(perturbed.items())
    batch = engine.generate(prompts, 2, temperature=1.0, max_new_tokens=48)

    def diffs(model, other=None) -> torch.Tensor:
        out = []
        for row in range(len(batch)):
            mask = batch.response_mask[row].bool()
            prompt = batch.prompts[row][batch.prompt_mask[row].bool()].tolist()
            response = batch.responses[row][mask].tolist()
            theirs = batch.log_probs[row][mask] if other is None else sequence_log_probs(other, prompt, response)
            out.append(sequence_log_probs(model, prompt, response) - theirs)
        return torch.cat(out).abs()

    hf_model.load_state_dict(perturbed)
    hf_model32.load_state_dict(perturbed)  # the same bf16 values, upcast
    try:
        matched = diffs(hf_model)
        floor = diffs(hf_model, hf_model32)
        hf_model.load_state_dict(base)
        against_old = diffs(hf_model)
    finally:
        hf_model.load_state_dict(base)
        hf_model32.load_state_dict(base)
        engine.update_weights(base.items())
    record.update(
        {
            "rollout_logprob_abs_diff_mean": round(matched.mean().item(), 5),
            "rollout_logprob_abs_diff_max": round(matched.max().item(), 5),
            "rollout_logprob_tokens": int(matched.numel()),
            "hf_bf16_vs_fp32_logprob_abs_diff_mean": round(floor.mean().item(), 5),
            "hf_bf16_vs_fp32_logprob_abs_diff_max": round(floor.max().item(), 5),
            "rollout_logprob_abs_diff_mean_vs_unperturbed_weights": round(against_old.mean().item(), 5),
        }
    )
    assert matched.mean() < tolerance(floor), (
        f"vLLM and transformers disagree: mean |Δ log p| = {matched.mean():.4f}, bf16 noise {floor.mean():.4f}"
    )
    assert against_old.mean() > matched.mean(), "the perturbed weights did not reach the engine"


def test_prompt_log_probs_of_a_fixed_sequence_match_transformers(
    engine, hf_model, hf_model32, tokenizer, record
) -> None:
    from vllm import SamplingParams, TokensPrompt

    text = (
        "The quick brown fox jumps over the lazy dog. Reinforcement learning from verifiable rewards trains "
        "a policy by sampling answers and scoring them."
    )
    ids = tokenizer(text)["input_ids"]
    engine.wake()
    out = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=ids)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )[0]
    vllm_lp = torch.as_tensor([out.prompt_logprobs[i][tok].logprob for i, tok in enumerate(ids) if i > 0])
    hf_lp = sequence_log_probs(hf_model, ids[:1], ids[1:])
    floor = (hf_lp - sequence_log_probs(hf_model32, ids[:1], ids[1:])).abs()
    diff = (vllm_lp - hf_lp).abs()
    record.update(
        {
            "prompt_logprob_abs_diff_mean": round(diff.mean().item(), 5),
            "prompt_logprob_abs_diff_max": round(diff.max().item(), 5),
            "prompt_logprob_tokens": len(ids) - 1,
            "prompt_hf_bf16_vs_fp32_abs_diff_mean": round(floor.mean().item(), 5),
        }
    )
    assert diff.mean() < tolerance(floor)


STORY = "Write a very long story about a lighthouse keeper, with many chapters."


def test_an_interrupted_generation_keeps_what_it_sampled_and_continues_where_it_stopped(engine, tokenizer, record):
    """Partial rollouts on the vLLM engine: an interrupt stops a greedy generation after the engine step in
    progress; the tokens kept are the uninterrupted generation's so far, with its log-probs, and generating on from
    them gives the uninterrupted generation's next tokens (same weights: prefill of the kept tokens instead of their
    decode, so bf16 may part the two later on a near tie; the first 16 must agree)."""
    import threading

    budget = 900
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": STORY}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    sampling = {"temperature": 0.0, "max_new_tokens": budget}
    (whole,) = split(engine.generate([prompt], 1, **sampling))
    assert len(whole[0]) > 200, f"the story ended after {len(whole[0])} tokens: too short to interrupt"

    interrupt = threading.Event()
    timer = threading.Timer(0.3, interrupt.set)
    timer.start()
    batch = engine.generate([prompt], 1, **sampling, interrupt=interrupt)
    timer.join()
    assert batch.finished is not None and not bool(batch.finished[0])
    ((kept, kept_log_probs),) = split(batch)
    cut = len(kept)
    assert 0 < cut < len(whole[0]), f"stopped after {cut} of {len(whole[0])} tokens"
    assert kept == whole[0][:cut]
    assert kept_log_probs == pytest.approx(whole[1][:cut], abs=1e-3)

    (rest,) = split(engine.generate([prompt + kept], 1, **{**sampling, "max_new_tokens": budget - cut}))
    agree = next((i for i, (a, b) in enumerate(zip(rest[0], whole[0][cut:], strict=False)) if a != b), len(rest[0]))
    record["interrupted_generation"] = {"tokens": len(whole[0]), "cut": cut, "continuation_agrees_for": agree}
    assert agree >= min(16, len(whole[0]) - cut), f"the continuation parts from the whole after {agree} tokens"

    interrupt.clear()
    unstopped = engine.generate([prompt], 1, **sampling, interrupt=interrupt)
    assert unstopped.finished is not None and bool(unstopped.finished[0])
    assert split(unstopped)[0][0] == whole[0]  # an interrupt never set changes nothing


def split(batch) -> list[tuple[list[int], list[float]]]:
    """Each row's generated tokens (up to and including eos) and their log-probs."""
    lengths = batch.response_mask.sum(-1).tolist()
    return [(batch.responses[i, :n].tolist(), batch.log_probs[i, :n].tolist()) for i, n in enumerate(lengths)]
