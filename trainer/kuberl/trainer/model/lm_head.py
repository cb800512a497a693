"""Per-token log-probs and entropy from a causal LM without its full logits.

A forward of ``N`` tokens through the output head would hold ``N × V`` logits, and their float32 log-softmax and
entropy several times that (49k vocabulary × 16k tokens × 4 bytes = 3.2 GB per copy). Here the head is applied to
chunks of :data:`CHUNK_TOKENS` hidden states at a time and each chunk is reduced to its ``(n,)`` log-probs and
entropies at once, so at most one chunk's logits exist at any time, forward or backward.

A plain linear head (every causal LM's ``lm_head``) goes through :class:`LinearHeadLogProbs`, whose backward
recomputes a chunk's logits once and forms their gradient from the saved log-sum-exp (verl's and Liger's fused linear
cross-entropy, in plain torch): one recompute per chunk instead of autograd's recompute of the forward plus the
backward of each of its operations. Any other head (a LoRA-wrapped one) runs under activation checkpointing, chunk
by chunk.

With ``compiled`` (``model.compile`` on CUDA) the per-chunk math around the head's matmul (:func:`chunk_log_probs`,
:func:`chunk_logits_grad`) runs through ``torch.compile``: the reduction reads the bf16 logits once or twice and the
gradient is written in one pass, where eager float32 math makes about ten passes over each chunk (for 16k response
tokens at Qwen2's 152k vocabulary about 255 GB against 35 GB, an estimated 65 ms on an H200). Without float32 copies a
chunk can be :data:`COMPILED_CHUNK_TOKENS` long for the same memory, which also cuts the float32 accumulations of the
head's weight gradient fourfold.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from kuberl.trainer.model.microbatch import Packed

KEYS = ("log_probs", "entropy")
"""What :func:`token_log_probs` returns, in this order."""
CHUNK_TOKENS = 1024
"""Tokens per head chunk: 1024 × 49k vocabulary × 4 bytes = 200 MB of float32 logits at a time."""
COMPILED_CHUNK_TOKENS = 4 * CHUNK_TOKENS
"""Tokens per head chunk when the chunk math is compiled: only the bf16 logits and their bf16 gradient exist (2 × 2
bytes per entry), about what an eager chunk's float32 logits and their float32 copies take at a quarter of the
tokens."""


def scaled_logits(logits: Tensor, temperature: float) -> Tensor:
    """Float32 logits divided by the sampling temperature (0: greedy, left unscaled)."""
    logits = logits.float()
    return logits / temperature if temperature > 0 else logits


def chunk_log_probs(
    logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(log p(target), logsumexp, entropy or None)``, float32, per row of one chunk of head outputs ``(n, V)``."""
    logits = scaled_logits(logits, temperature)
    lse = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return log_probs, lse, None
    log_p = logits - lse.unsqueeze(-1)
    return log_probs, lse, -(log_p.exp() * log_p).sum(-1)  # −Σ_v p_v log p_v: no cancellation, unlike lse − Σ p·z


def chunk_logits_grad(
    logits: Tensor,
    targets: Tensor,
    temperature: float,
    lse: Tensor,
    grad_log_probs: Tensor,
    entropy: Tensor | None,
    grad_entropy: Tensor | None,
) -> Tensor:
    """The gradient of one chunk's head outputs ``(n, V)``, in their dtype, from the saved log-sum-exp and entropy.

    With ``log p = z/T − lse``: d log p_y / dz = (onehot(y) − p)/T and dH/dz = −p·(log p + H)/T, so
    dz = (onehot·g_lp − p·(g_lp + g_H·(log p + H)))/T.
    """
    log_p = scaled_logits(logits, temperature) - lse.unsqueeze(-1)
    g = grad_log_probs.unsqueeze(-1)
    if grad_entropy is None or entropy is None:
        weight = g
    else:
        weight = (log_p + entropy.unsqueeze(-1)).mul_(grad_entropy.unsqueeze(-1)).add_(g)
    grad = log_p.exp_().mul_(weight).neg_()
    if temperature > 0:
        grad, g = grad.div_(temperature), g / temperature
    grad = grad.to(logits.dtype)
    return grad.scatter_add_(-1, targets.unsqueeze(-1), g.to(grad.dtype))


ChunkFunctions = tuple[Callable[..., tuple[Tensor, Tensor, Tensor | None]], Callable[..., Tensor]]


@functools.cache
def compiled_chunk_functions() -> ChunkFunctions:
    """:func:`chunk_log_probs` and :func:`chunk_logits_grad` through ``torch.compile`` (created once per process)."""
    return torch.compile(chunk_log_probs), torch.compile(chunk_logits_grad)


def chunk_functions(compiled: bool) -> ChunkFunctions:
    return compiled_chunk_functions() if compiled else (chunk_log_probs, chunk_logits_grad)


def rows_dynamic(*tensors: Tensor | None) -> None:
    """Mark the token dimension dynamic for ``torch.compile`` (every micro-batch's last chunk has its own length);
    the vocabulary stays static."""
    for t in tensors:
        if t is not None:
            torch._dynamo.maybe_mark_dynamic(t, 0)


class LinearHeadLogProbs(torch.autograd.Function):
    """``(log_probs, entropy)`` ``(N,)`` of ``targets`` under ``softmax(linear(hidden) / temperature)``, chunked.

    The forward saves the head's input and one log-sum-exp (and entropy) per token. The backward rebuilds each chunk's
    logits from one matmul, turns them into their gradient (:func:`chunk_logits_grad`) and applies it to the head's
    input and weight; the weight's gradient is summed over chunks in float32.
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
        compiled: bool,
    ) -> tuple[Tensor, Tensor]:
        reduce, _ = chunk_functions(compiled)
        n = hidden.shape[0]
        log_probs = hidden.new_empty(n, dtype=torch.float32)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else log_probs.new_empty(0)
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            logits, chunk_targets = F.linear(hidden[start:end], weight, bias), targets[start:end]
            if compiled:
                rows_dynamic(logits, chunk_targets)
            log_probs[start:end], lse[start:end], chunk_entropy = reduce(
                logits, chunk_targets, temperature, with_entropy
            )
            if chunk_entropy is not None:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.chunk_tokens, ctx.compiled = temperature, chunk_tokens, compiled
        ctx.set_materialize_grads(False)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        _, logits_grad = chunk_functions(ctx.compiled)
        n = hidden.shape[0]
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        if grad_log_probs is None:
            grad_log_probs = torch.zeros_like(lse)
        for start in range(0, n, ctx.chunk_tokens):
            end = min(start + ctx.chunk_tokens, n)
            h = hidden[start:end]
            inputs = [F.linear(h, weight, bias), targets[start:end], lse[start:end], grad_log_probs[start:end]]
            inputs += [None, None] if grad_entropy is None else [entropy[start:end], grad_entropy[start:end]]
            if ctx.compiled:
                rows_dynamic(*inputs)
            logits, chunk_targets, *saved = inputs
            grad_logits = logits_grad(logits, chunk_targets, ctx.temperature, *saved)
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
            None,
        )


def token_log_probs(
    hidden: Tensor,
    head: nn.Module,
    targets: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    compiled: bool = False,
    chunk_tokens: int | None = None,
) -> dict[str, Tensor]:
    """``log_probs`` (and ``entropy``), ``(N,)``, of ``targets`` under ``softmax(head(hidden) / temperature)``.

    ``hidden`` ``(N, H)``, ``targets`` ``(N,)``. The logits are float32 whatever the head's dtype. ``compiled``: a
    plain linear head's chunk math runs through ``torch.compile``, in chunks of :data:`COMPILED_CHUNK_TOKENS` unless
    ``chunk_tokens`` says otherwise.
    """
    if type(head) is nn.Linear:
        chunk = chunk_tokens or (COMPILED_CHUNK_TOKENS if compiled else CHUNK_TOKENS)
        log_probs, entropy = LinearHeadLogProbs.apply(
            hidden, head.weight, head.bias, targets, temperature, with_entropy, chunk, compiled
        )
        return {"log_probs": log_probs, "entropy": entropy} if with_entropy else {"log_probs": log_probs}
    chunk_tokens = chunk_tokens or CHUNK_TOKENS

    def reduce(h: Tensor, y: Tensor) -> Tensor:
        log_probs, _, entropy = chunk_log_probs(head.forward(h), y, temperature, with_entropy)
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
    model: nn.Module,
    packed: Packed,
    *,
    temperature: float,
    with_entropy: bool,
    device: torch.device,
    compiled: bool = False,
) -> dict[str, Tensor]:
    """Log-probs (and entropy) of a packed micro-batch's response tokens, ``(b, r)`` each, 0 at padding.

    The model runs its own forward with ``logits_to_keep`` set to the ``N`` predicting positions. Hooks on the output
    head reduce those hidden states with :func:`token_log_probs` (the head itself gets an empty input) and return the
    reduction as the head's output, so it leaves the model as ``logits`` ``(1, 1 or 2, N)``: the result must be an
    output of the model's forward, because FSDP gathers the root's parameters for the backward pass (the output head
    recomputed chunk by chunk) in a hook on those outputs. ``compiled``: as :func:`token_log_probs`.
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
    packed = packed.to(device)
    targets = packed.targets
    reduced: list[Tensor] = []

    def reduce_head_input(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        hidden = args[0]
        out = token_log_probs(
            hidden[0], module, targets, temperature=temperature, with_entropy=with_entropy, compiled=compiled
        )
        reduced.append(torch.stack([out[key] for key in KEYS[: len(out)]]).unsqueeze(0))
        return (hidden[:, :0],)

    def replace_head_output(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
        return reduced.pop()

    handles = [head.register_forward_pre_hook(reduce_head_input), head.register_forward_hook(replace_head_output)]
    try:
        logits = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            logits_to_keep=packed.predictors,
            **packed.attention_kwargs(),
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
