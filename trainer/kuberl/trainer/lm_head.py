"""Per-token log-probs and entropy from a causal LM without its full logits.

A forward of ``N`` tokens through the output head would hold ``N × V`` logits, and their float32 log-softmax and
entropy several times that (49k vocabulary × 16k tokens × 4 bytes = 3.2 GB per copy). Here the head is applied to
chunks of :data:`CHUNK_TOKENS` hidden states at a time; each chunk is reduced to its ``(n,)`` log-probs and
entropies at once, and under autograd the chunk is recomputed in the backward pass (activation checkpointing), so
at most one chunk's logits exist at any time, forward or backward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from kuberl.trainer.microbatch import Packed

KEYS = ("log_probs", "entropy")
"""What :func:`token_log_probs` returns, in this order."""
CHUNK_TOKENS = 1024
"""Tokens per head chunk: 1024 × 49k vocabulary × 4 bytes = 200 MB of float32 logits at a time."""


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

    def reduce(h: Tensor, y: Tensor) -> Tensor:
        logits = head.forward(h).float()
        if temperature > 0:
            logits = logits / temperature
        lse = torch.logsumexp(logits, dim=-1)
        out = [logits.gather(-1, y.unsqueeze(-1)).squeeze(-1) - lse]
        if with_entropy:
            out.append(lse - (torch.softmax(logits, dim=-1) * logits).sum(-1))
        return torch.stack(out)

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
