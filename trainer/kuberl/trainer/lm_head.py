"""Per-token log-probs and entropy from a causal LM without its full logits.

A forward of ``N`` tokens through the output head would hold ``N × V`` logits, and their float32 log-softmax and
entropy several times that (49k vocabulary × 16k tokens × 4 bytes = 3.2 GB per copy). Here the head is applied to
chunks of :data:`CHUNK_TOKENS` hidden states at a time and each chunk is reduced to its ``(n,)`` log-probs and
entropies at once, so at most one chunk's logits exist at any time, forward or backward.

A plain linear head (every causal LM's ``lm_head``) goes through :class:`LinearHeadLogProbs`, whose backward
recomputes a chunk's logits once and writes their gradient in place from the saved log-sum-exp (verl's and Liger's
fused linear cross-entropy, in plain torch): one recompute and a few in-place passes per chunk instead of autograd's
recompute of the forward plus the backward of each of its operations. Any other head (a LoRA-wrapped one) runs
under activation checkpointing, chunk by chunk.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from kuberl.trainer.microbatch import Packed

KEYS = ("log_probs", "entropy")
"""What :func:`token_log_probs` returns, in this order."""
CHUNK_TOKENS = 1024
"""Tokens per head chunk: 1024 × 49k vocabulary × 4 bytes = 200 MB of float32 logits at a time."""


def scaled_logits(logits: Tensor, temperature: float) -> Tensor:
    """Float32 logits divided by the sampling temperature (0: greedy, left unscaled)."""
    logits = logits.float()
    return logits / temperature if temperature > 0 else logits


def reduce_logits(logits: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(log p(target), logsumexp, entropy or None)`` per row of float32 ``logits`` ``(n, V)``."""
    lse = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return log_probs, lse, None
    log_p = logits - lse.unsqueeze(-1)
    entropy = -(log_p.exp().unsqueeze(-2) @ log_p.unsqueeze(-1)).view(-1)  # −Σ_v p_v log p_v, no (n, V) product
    return log_probs, lse, entropy


class LinearHeadLogProbs(torch.autograd.Function):
    """``(log_probs, entropy)`` ``(N,)`` of ``targets`` under ``softmax(linear(hidden) / temperature)``, chunked.

    The forward saves the head's input and one log-sum-exp per token. For a chunk with logits ``z``, ``log p =
    z − lse`` and ``p = exp(log p)``: d log p_y / dz = onehot(y) − p, and dH/dz = −p·(log p + H). The backward
    rebuilds ``log p`` from one matmul, forms ``dz`` in place and applies it to the head's input and weight; the
    weight's gradient is summed over chunks in float32.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        with_entropy: bool,
        chunk_tokens: int,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        log_probs = hidden.new_empty(n, dtype=torch.float32)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else log_probs.new_empty(0)
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            logits = scaled_logits(F.linear(hidden[start:end], weight, bias), temperature)
            log_probs[start:end], lse[start:end], chunk_entropy = reduce_logits(
                logits, targets[start:end], with_entropy
            )
            if chunk_entropy is not None:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        ctx.set_materialize_grads(False)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        temperature, n = ctx.temperature, hidden.shape[0]
        scale = 1.0 / temperature if temperature > 0 else 1.0
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        for start in range(0, n, ctx.chunk_tokens):
            end = min(start + ctx.chunk_tokens, n)
            h = hidden[start:end]
            g_lp = grad_log_probs[start:end] if grad_log_probs is not None else lse.new_zeros(end - start)
            log_p = scaled_logits(F.linear(h, weight, bias), temperature).sub_(lse[start:end].unsqueeze(-1))
            if grad_entropy is not None:  # dz = −p·(g_lp + g_H·(log p + H)) + onehot·g_lp
                probs = log_p.exp()
                factor = log_p.add_(entropy[start:end].unsqueeze(-1)).mul_(grad_entropy[start:end].unsqueeze(-1))
                grad_logits = probs.mul_(factor.add_(g_lp.unsqueeze(-1)))
            else:  # dz = −p·g_lp + onehot·g_lp
                grad_logits = log_p.exp_().mul_(g_lp.unsqueeze(-1))
            grad_logits.neg_().scatter_add_(-1, targets[start:end].unsqueeze(-1), g_lp.unsqueeze(-1))
            grad_logits = grad_logits.mul_(scale).to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += grad_logits.t() @ h
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


def token_log_probs(
    hidden: Tensor,
    head: nn.Module,
    targets: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int = CHUNK_TOKENS,
) -> dict[str, Tensor]:
    """``log_probs`` (and ``entropy``), ``(N,)``, of ``targets`` under ``softmax(head(hidden) / temperature)``.

    ``hidden`` ``(N, H)``, ``targets`` ``(N,)``. The logits are float32 whatever the head's dtype.
    """
    if type(head) is nn.Linear:
        log_probs, entropy = LinearHeadLogProbs.apply(
            hidden, head.weight, head.bias, targets, temperature, with_entropy, chunk_tokens
        )
        return {"log_probs": log_probs, "entropy": entropy} if with_entropy else {"log_probs": log_probs}

    def reduce(h: Tensor, y: Tensor) -> Tensor:
        log_probs, _, entropy = reduce_logits(scaled_logits(head.forward(h), temperature), y, with_entropy)
        return torch.stack([log_probs] if entropy is None else [log_probs, entropy])

    chunks = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, y = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if torch.is_grad_enabled() and h.requires_grad:
            chunks.append(checkpoint(reduce, h, y, use_reentrant=False))
        else:
            chunks.append(reduce(h, y))
    stacked = torch.cat(chunks, dim=1) if chunks else hidden.new_zeros((2 if with_entropy else 1, 0))
    return dict(zip(KEYS, stacked, strict=False))


def packed_response_log_probs(
    model: nn.Module, packed: Packed, *, temperature: float, with_entropy: bool, device: torch.device
) -> dict[str, Tensor]:
    """Log-probs (and entropy) of a packed micro-batch's response tokens, ``(b, r)`` each, 0 at padding.

    The model runs its own forward with ``logits_to_keep`` set to the ``N`` predicting positions. Hooks on the output
    head reduce those hidden states with :func:`token_log_probs` (the head itself gets an empty input) and return the
    reduction as the head's output, so it leaves the model as ``logits`` ``(1, 1 or 2, N)``: the result must be an
    output of the model's forward, because FSDP gathers the root's parameters for the backward pass (the output head
    recomputed chunk by chunk) in a hook on those outputs.
    """
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Module):
        raise TypeError(f"{type(model).__name__} has no output head (get_output_embeddings() is None)")
    if getattr(model.config, "final_logit_softcapping", None):
        raise NotImplementedError(
            f"{type(model).__name__} caps its logits after the output head (final_logit_softcapping); "
            "the trainer's chunked log-probs do not support such models"
        )
    targets = packed.targets.to(device)
    reduced: list[Tensor] = []

    def reduce_head_input(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        hidden = args[0]
        out = token_log_probs(hidden[0], module, targets, temperature=temperature, with_entropy=with_entropy)
        reduced.append(torch.stack([out[key] for key in KEYS[: len(out)]]).unsqueeze(0))
        return (hidden[:, :0],)

    def replace_head_output(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
        return reduced.pop()

    handles = [head.register_forward_pre_hook(reduce_head_input), head.register_forward_hook(replace_head_output)]
    try:
        logits = model(
            input_ids=packed.input_ids.to(device),
            position_ids=packed.position_ids.to(device),
            use_cache=False,
            logits_to_keep=packed.predictors.to(device),
            **packed.attention_kwargs(device),
        ).logits
    finally:
        for handle in handles:
            handle.remove()
    expected = (1, 2 if with_entropy else 1, targets.numel())
    if tuple(logits.shape) != expected:
        raise RuntimeError(
            f"{type(model).__name__}'s forward changed its output head's result ({tuple(logits.shape)}, expected "
            f"{expected}): it needs the plain ``logits = lm_head(hidden_states[:, logits_to_keep])`` of a causal LM"
        )
    return {key: packed.unpack(logits[0, i]) for i, key in enumerate(KEYS[: expected[1]])}
