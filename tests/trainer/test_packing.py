"""Packed micro-batches (verl's use_remove_padding) give the padded batch's log-probs, entropies, values, losses and
gradients: each row attends to itself only, and no padding token enters a pass."""

import pytest
import torch
from torch import Tensor, nn

from kuberl.trainer.algorithms.losses import PolicyLossConfig, policy_loss
from kuberl.trainer.model.attention import VARLEN, use_varlen_attention
from kuberl.trainer.model.lm_head import packed_response_log_probs
from kuberl.trainer.model.loading import load_causal_lm
from kuberl.trainer.model.microbatch import Rows, model_inputs, pack, trim
from kuberl.trainer.workers.critic import ValueModel

TINY = "tiny://{family}?hidden=32&layers=2&heads=4&kv_heads=2&seed=3"
CPU = torch.device("cpu")


def ragged_rows(prompt_lens: list[int], response_lens: list[int], vocab: int, seed: int = 0) -> Rows:
    """Left-padded prompts and right-padded responses of the given real lengths, random ids and advantages."""
    g = torch.Generator().manual_seed(seed)
    b, p, r = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompt_mask = torch.zeros(b, p, dtype=torch.long)
    response_mask = torch.zeros(b, r, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompt_mask[i, p - pl :] = 1
        response_mask[i, :rl] = 1
    return {
        "prompts": torch.randint(4, vocab, (b, p), generator=g) * prompt_mask,
        "prompt_mask": prompt_mask,
        "responses": torch.randint(4, vocab, (b, r), generator=g) * response_mask,
        "response_mask": response_mask,
        "advantages": torch.randn(b, r, generator=g),
        "old_log_probs": -torch.rand(b, r, generator=g) * 5,
    }


def padded_log_probs(model: nn.Module, rows: Rows, temperature: float) -> dict[str, Tensor]:
    """The reference: a padded forward with SDPA, an attention mask and the full float32 logits."""
    input_ids, attention_mask, position_ids = model_inputs(rows)
    p, r = rows["prompts"].shape[1], rows["responses"].shape[1]
    packed_attention = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    model.set_attn_implementation(packed_attention)
    logits = logits[:, p - 1 : p + r - 1].float() / temperature
    log_probs = torch.log_softmax(logits, -1).gather(-1, rows["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    mask = rows["response_mask"].float()
    return {"log_probs": log_probs * mask, "entropy": entropy * mask}


def test_pack_concatenates_real_tokens_and_restarts_positions():
    rows = trim(ragged_rows([2, 3], [3, 1], vocab=50))
    packed = pack(rows)
    assert packed.input_ids[0].tolist() == [
        *rows["prompts"][0, 1:].tolist(),
        *rows["responses"][0, :3].tolist(),
        *rows["prompts"][1].tolist(),
        *rows["responses"][1, :1].tolist(),
    ]
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    # response token j of a row is predicted by the token before it: the last prompt token for j = 0
    assert packed.predictors.tolist() == [1, 2, 3, 7]
    assert packed.cu_seq_lens.tolist() == [0, 5, 9]
    assert packed.longest == 5
    assert packed.targets.tolist() == [*rows["responses"][0].tolist(), int(rows["responses"][1, 0])]


def test_unpack_puts_values_back_and_zeros_padding():
    packed = pack(trim(ragged_rows([2, 3], [3, 1], vocab=50)))
    assert packed.unpack(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]


def test_a_gap_in_the_response_mask_is_refused():
    rows = trim(ragged_rows([2], [3], vocab=50))
    rows["response_mask"][0, 1] = 0
    with pytest.raises(ValueError, match="response_mask has a gap"):
        pack(rows)


def tiny(attention: str, family: str = "llama") -> nn.Module:
    """The tiny model with transformers' SDPA (a block-diagonal mask over the pack) or the per-row VARLEN."""
    model = load_causal_lm(TINY.format(family=family), torch.float32)
    if attention == "varlen":
        use_varlen_attention(model)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_log_probs_entropy_loss_and_gradients_match_the_padded_batch(temperature, attention, family):
    model = tiny(attention, family)
    rows = trim(ragged_rows([5, 2, 7, 3], [4, 6, 1, 3], vocab=model.config.vocab_size))
    mask = rows["response_mask"].float()

    def loss_and_grads(out: dict[str, Tensor]) -> tuple[Tensor, list[Tensor]]:
        loss, _ = policy_loss(
            out["log_probs"],
            rows["old_log_probs"],
            rows["advantages"],
            mask,
            config=PolicyLossConfig(),
            agg_mode="token-mean",
            batch_tokens=float(mask.sum()),
            batch_seqs=4.0,
            loss_scale_factor=6.0,
        )
        loss = loss - 0.01 * (out["entropy"] * mask).sum() / mask.sum()
        model.zero_grad()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    padded = padded_log_probs(model, rows, temperature)
    packed = packed_response_log_probs(model, pack(rows), temperature=temperature, with_entropy=True, device=CPU)
    torch.testing.assert_close(packed["log_probs"], padded["log_probs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed["entropy"], padded["entropy"], atol=1e-5, rtol=0)
    loss_padded, grads_padded = loss_and_grads(padded)
    loss_packed, grads_packed = loss_and_grads(packed)
    torch.testing.assert_close(loss_packed, loss_padded, atol=1e-5, rtol=0)
    for g_packed, g_padded in zip(grads_packed, grads_padded, strict=True):
        torch.testing.assert_close(g_packed, g_padded, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_rows_in_one_packed_sequence_do_not_see_each_other(attention):
    model = tiny(attention)
    rows = trim(ragged_rows([4, 3], [3, 3], vocab=model.config.vocab_size))
    alone = packed_response_log_probs(
        model, pack({k: v[1:] for k, v in rows.items()}), temperature=1.0, with_entropy=False, device=CPU
    )
    rows["prompts"][0] = rows["prompts"][0].flip(0) * rows["prompt_mask"][0]  # change the first row only
    together = packed_response_log_probs(model, pack(rows), temperature=1.0, with_entropy=False, device=CPU)
    torch.testing.assert_close(together["log_probs"][1], alone["log_probs"][0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_packed_values_and_their_gradients_match_the_padded_batch(attention):
    torch.manual_seed(0)
    critic = ValueModel(tiny(attention))
    nn.init.normal_(critic.value_head.weight, std=0.1)  # values of a few units, as a trained head gives
    rows = trim(ragged_rows([5, 2, 7], [4, 6, 1], vocab=critic.config.vocab_size))
    mask = rows["response_mask"].float()
    returns = torch.randn(mask.shape)

    input_ids, attention_mask, position_ids = model_inputs(rows)
    critic.backbone.set_attn_implementation("sdpa")
    hidden = critic.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    critic.backbone.set_attn_implementation(attention if attention == "sdpa" else VARLEN)
    p, r = rows["prompts"].shape[1], rows["responses"].shape[1]
    padded = critic.value_head(hidden.last_hidden_state).squeeze(-1)[:, p - 1 : p + r - 1] * mask
    packed_rows = pack(rows)
    values = critic(packed_rows.input_ids, packed_rows.position_ids, **packed_rows.attention_kwargs())
    packed = packed_rows.unpack(values[0, packed_rows.predictors])
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)

    grads = []
    for values in (padded, packed):
        critic.zero_grad()
        (((values - returns) ** 2 * mask).sum() / mask.sum()).backward()
        grads.append([p.grad.clone() for p in critic.parameters()])
    for g_packed, g_padded in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g_packed, g_padded, atol=1e-5, rtol=0)
