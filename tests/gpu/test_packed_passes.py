"""Packed micro-batches on the GPU, bf16: the same log-probs and gradients as the padded batch with each attention
path (the trainer's kuberl_varlen: PyTorch's varlen flash attention, else flash_attn's, else SDPA per row;
transformers' SDPA with a block-diagonal mask; flash_attention_2 when installed), and the packed forward's time
against the padded one's (measured, not asserted)."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from kuberl.trainer.model.attention import VARLEN, use_varlen_attention
from kuberl.trainer.model.fsdp import wrap_decoder_layers
from kuberl.trainer.model.lm_head import packed_response_log_probs
from kuberl.trainer.model.loading import load_causal_lm
from kuberl.trainer.model.microbatch import model_inputs, pack, trim

pytestmark = pytest.mark.gpu

SHAPE = "tiny://llama?hidden=1024&layers=8&heads=16&kv_heads=8&positions=4096&seed=0"
IMPLEMENTATIONS = [VARLEN, "sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])


def ragged_rows(n: int, max_prompt: int, max_response: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompt_lens = torch.randint(max_prompt // 4, max_prompt + 1, (n,), generator=g)
    response_lens = torch.randint(1, max_response + 1, (n,), generator=g)
    pos_p = torch.arange(max_prompt).expand(n, -1)
    pos_r = torch.arange(max_response).expand(n, -1)
    prompt_mask = (pos_p >= max_prompt - prompt_lens[:, None]).long()
    response_mask = (pos_r < response_lens[:, None]).long()
    return {
        "prompts": torch.randint(4, vocab, (n, max_prompt), generator=g) * prompt_mask,
        "prompt_mask": prompt_mask,
        "responses": torch.randint(4, vocab, (n, max_response), generator=g) * response_mask,
        "response_mask": response_mask,
    }


def padded(model, rows) -> torch.Tensor:
    packed_attention = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    input_ids, attention_mask, position_ids = (t.cuda() for t in model_inputs(rows))
    p, r = rows["prompts"].shape[1], rows["responses"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, p - 1 : p + r - 1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, rows["responses"].cuda().unsqueeze(-1)).squeeze(-1)
    model.set_attn_implementation(packed_attention)
    return lp * rows["response_mask"].cuda()


def timed(fn) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / 5


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@torch.no_grad()
def test_packed_log_probs_match_the_padded_batch_in_bf16(implementation, record):
    model = load_causal_lm(SHAPE, torch.bfloat16).cuda().eval()
    if implementation == VARLEN:
        use_varlen_attention(model)
    else:
        model.set_attn_implementation(implementation)
    rows = trim(ragged_rows(32, 256, 256, model.config.vocab_size))
    mask = rows["response_mask"].cuda().bool()
    reference = padded(model, rows)
    packed_rows = pack(rows)
    device = torch.device("cuda")
    out = packed_response_log_probs(model, packed_rows, temperature=1.0, with_entropy=True, device=device)
    diff = (out["log_probs"] - reference)[mask].abs()
    record[f"{implementation}_logprob_abs_diff_mean"] = round(diff.mean().item(), 5)
    record[f"{implementation}_logprob_abs_diff_max"] = round(diff.max().item(), 5)
    padded_tokens = rows["prompts"].numel() + rows["responses"].numel()
    record[f"{implementation}_real_token_fraction"] = round(packed_rows.input_ids.numel() / padded_tokens, 3)
    record[f"{implementation}_padded_forward_s"] = round(timed(lambda: padded(model, rows)), 5)
    record[f"{implementation}_packed_forward_s"] = round(
        timed(lambda: packed_response_log_probs(model, packed_rows, temperature=1.0, with_entropy=True, device=device)),
        5,
    )
    assert diff.mean().item() < 0.02, record  # bf16 noise on random weights, not a misplaced token


def test_varlen_gradients_match_the_padded_batch_in_bf16(record):
    """The backward of the varlen kernel: every parameter's gradient of the summed response log-probs points where the
    padded batch's does (cosine over all parameters; bf16 noise, not a misplaced row, stays far above 0.99)."""
    model = load_causal_lm(SHAPE, torch.bfloat16).cuda()
    use_varlen_attention(model)
    rows = trim(ragged_rows(32, 256, 256, model.config.vocab_size))

    def gradient(loss_of) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss_of().backward()
        return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])

    reference = gradient(lambda: padded(model, rows).sum())
    device = torch.device("cuda")
    packed_rows = pack(rows)
    got = gradient(
        lambda: packed_response_log_probs(model, packed_rows, temperature=1.0, with_entropy=False, device=device)[
            "log_probs"
        ].sum()
    )
    cosine = torch.nn.functional.cosine_similarity(got, reference, dim=0).item()
    record["varlen_gradient_cosine"] = round(cosine, 5)
    record["varlen_gradient_norm_ratio"] = round((got.norm() / reference.norm()).item(), 5)
    assert cosine > 0.99, record


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_match_eager_over_micro_batches_of_changing_length(checkpointing, record):
    """``model.compile``: log-probs and gradients of compiled decoder layers and head equal the eager ones (bf16
    noise), for packed micro-batches of three different lengths (dynamic shapes), with and without gradient
    checkpointing."""
    import torch._dynamo

    model = load_causal_lm(SHAPE, torch.bfloat16).cuda()
    use_varlen_attention(model)
    device = torch.device("cuda")
    batches = [pack(trim(ragged_rows(n, 256, 256, model.config.vocab_size))) for n in (8, 13, 32)]

    def run(compiled: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
        results = []
        for packed_rows in batches:
            model.zero_grad(set_to_none=True)
            out = packed_response_log_probs(
                model, packed_rows, temperature=0.8, with_entropy=True, device=device, compiled=compiled
            )
            (out["log_probs"].sum() + 0.1 * out["entropy"].sum()).backward()
            grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
            results.append((out["log_probs"].detach().float(), grads))
        return results

    eager = run()
    torch._dynamo.reset()
    wrap_decoder_layers(model, compile_layers=True, checkpointing=checkpointing)
    tag = "checkpointed" if checkpointing else "plain"
    start = time.perf_counter()
    compiled = run(compiled=True)
    record[f"compile_first_pass_s_{tag}"] = round(time.perf_counter() - start, 2)
    record[f"compiled_pass_s_{tag}"] = round(timed(lambda: run(compiled=True)), 4)
    for (lp_eager, g_eager), (lp_compiled, g_compiled) in zip(eager, compiled, strict=True):
        diff = (lp_compiled - lp_eager).abs().mean().item()
        cosine = torch.nn.functional.cosine_similarity(g_compiled, g_eager, dim=0).item()
        record.setdefault(f"compiled_logprob_abs_diff_mean_{tag}", []).append(round(diff, 5))
        record.setdefault(f"compiled_gradient_cosine_{tag}", []).append(round(cosine, 5))
        assert diff < 0.02 and cosine > 0.99, record


def test_compiled_head_matches_eager_at_qwen2_vocabulary(record):
    """``model.compile``'s output head at Qwen2-0.5B's shape (896 → 151,936), bf16, 16k tokens in ragged chunks: the
    compiled chunk math gives the eager log-probs, entropy and gradients (bf16 noise); its time and peak memory
    against the eager one's are recorded (measured, not asserted)."""
    from torch import nn

    from kuberl.trainer.model.lm_head import token_log_probs

    torch.manual_seed(0)
    hidden_size, vocab, tokens = 896, 151_936, 16_384 + 77
    head = nn.Linear(hidden_size, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
    nn.init.normal_(head.weight, std=0.02)
    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, vocab, (tokens,), device="cuda")

    def run(compiled: bool) -> list[torch.Tensor]:
        head.zero_grad(set_to_none=True)
        h = hidden.detach().requires_grad_()
        out = token_log_probs(h, head, targets, temperature=0.8, with_entropy=True, compiled=compiled)
        (out["log_probs"].sum() - 0.01 * out["entropy"].sum()).backward()
        return [out["log_probs"].detach(), out["entropy"].detach(), h.grad.float(), head.weight.grad.float()]

    results = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        results[name] = run(compiled)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        record[f"head_{name}_s"] = round(timed(lambda compiled=compiled: run(compiled)), 4)
        record[f"head_{name}_peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 2)
    eager, compiled = results["eager"], results["compiled"]
    for i, key in enumerate(("log_probs", "entropy")):
        record[f"head_compiled_{key}_abs_diff_mean"] = round((compiled[i] - eager[i]).abs().mean().item(), 6)
    for i, key in ((2, "hidden"), (3, "weight")):
        cosine = torch.nn.functional.cosine_similarity(compiled[i].flatten(), eager[i].flatten(), dim=0).item()
        record[f"head_compiled_{key}_gradient_cosine"] = round(cosine, 6)
    assert record["head_compiled_log_probs_abs_diff_mean"] < 1e-3, record
    assert record["head_compiled_entropy_abs_diff_mean"] < 1e-3, record
    assert record["head_compiled_hidden_gradient_cosine"] > 0.999, record
    assert record["head_compiled_weight_gradient_cosine"] > 0.999, record
