"""Attention over packed rows (:func:`kuberl.trainer.microbatch.pack`) at the cost of the rows, not of the pack.

Packed rows attend inside themselves only. transformers' SDPA path gets that from a dense ``T × T`` block-diagonal
mask, which costs ``T²`` per head (three times the padded batch's time for 64 short rows on a CPU, and worse as the
token budget grows); flash-attention's varlen kernel costs ``Σ Lᵢ²``. :data:`VARLEN` is an attention implementation
that takes the row boundaries (``cu_seq_lens_q``, which the trainer passes to every forward) and runs
flash-attention varlen where it is installed on a GPU, else SDPA once per row with a causal kernel and no mask.
"""

from __future__ import annotations

import importlib.util
import itertools
from typing import Any

import torch
from torch import Tensor, nn

VARLEN = "kuberl_varlen"
"""The name the implementation is registered under in transformers' attention interfaces."""


def varlen_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """``query`` ``(1, heads, T, d)``, ``key``/``value`` ``(1, kv_heads, T, d)`` to ``(1, T, heads, d)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        raise ValueError(
            f"{VARLEN} attention runs packed rows only: pass the rows' bounds (Packed.attention_kwargs) to the forward"
        )
    if query.is_cuda and importlib.util.find_spec("flash_attn") is not None:
        from transformers.integrations.flash_attention import flash_attention_forward

        out, _ = flash_attention_forward(module, query, key, value, None, dropout, scaling, **kwargs)
        return out, None
    bounds = cu.tolist()
    parts = [
        sdpa_attention_forward(
            module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, dropout, scaling, is_causal=True
        )[0]
        for s, e in itertools.pairwise(bounds)
    ]
    return torch.cat(parts, dim=1), None


def use_varlen_attention(model: nn.Module) -> None:
    """Register :data:`VARLEN` with transformers (once per process) and switch ``model`` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(VARLEN, varlen_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN, flash_attention_mask)  # no mask: the rows' bounds say it all
    set_implementation = getattr(model, "set_attn_implementation", None)
    if not callable(set_implementation):
        raise TypeError(f"{type(model).__name__} cannot change its attention implementation")
    set_implementation(VARLEN)
