"""Attention over packed rows (:func:`kuberl.trainer.model.microbatch.pack`) at the cost of the rows, not of the pack.

Packed rows attend inside themselves only. transformers' SDPA path gets that from a dense ``T × T`` block-diagonal
mask, which costs ``T²`` per head (three times the padded batch's time for 64 short rows on a CPU, and worse as the
token budget grows); flash-attention's varlen kernel costs ``Σ Lᵢ²``. :data:`VARLEN` is an attention implementation
that takes the row boundaries (``cu_seq_lens_q``, which the trainer passes to every forward) and runs, on a GPU,
PyTorch's own flash-attention varlen kernel (``torch.nn.attention.varlen``, forward and backward, no extra package),
else the ``flash_attn`` package's where it is installed; elsewhere (CPU) SDPA once per row with a causal kernel and
no mask.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import itertools
from collections.abc import Callable
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
    flash_ready = query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and dropout == 0.0
    if flash_ready and (torch_varlen := _torch_varlen()) is not None:
        return torch_varlen(query, key, value, cu, kwargs["max_length_q"], scaling), None
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


@functools.cache
def _torch_varlen() -> Callable[[Tensor, Tensor, Tensor, Tensor, int, float | None], Tensor] | None:
    """PyTorch's varlen flash attention as ``(query, key, value, cu, longest, scaling) -> (1, T, heads, d)``, or
    None before PyTorch 2.10. Its keyword arguments changed between releases (``is_causal`` first, then a causal
    ``window_size``; ``scale``; ``enable_gqa``): read from its signature, so that each release gets what it takes."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" not in params and "window_size" not in params:
        return None
    causal: dict[str, Any] = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}

    def attend(query: Tensor, key: Tensor, value: Tensor, cu: Tensor, longest: int, scaling: float | None) -> Tensor:
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, heads, d)
        extra = dict(causal)
        if k.shape[1] != q.shape[1]:
            if "enable_gqa" in params:
                extra["enable_gqa"] = True
            else:
                k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        if scaling is not None:
            if "scale" in params:
                extra["scale"] = scaling
            elif abs(scaling - q.shape[-1] ** -0.5) > 1e-9:
                raise ValueError(f"this PyTorch's varlen_attn takes no scale; the model's is {scaling}")
        cu32 = cu.to(torch.int32)
        out = varlen_attn(q, k, v, cu32, cu32, longest, longest, **extra)  # no return_aux: one tensor
        assert isinstance(out, Tensor)
        return out.unsqueeze(0)

    return attend


def use_varlen_attention(model: nn.Module) -> None:
    """Register :data:`VARLEN` with transformers (once per process) and switch ``model`` to it.

    No mask function is registered with it: for an implementation without one, transformers builds no mask at all,
    which is right (the rows' bounds say it all). With one, every forward would also look for packed rows in the
    positions and read the answer back with ``.all()``, a wait for the GPU before each forward.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    set_implementation = getattr(model, "set_attn_implementation", None)
    if not callable(set_implementation):
        raise TypeError(f"{type(model).__name__} cannot change its attention implementation")
    set_implementation(VARLEN)
