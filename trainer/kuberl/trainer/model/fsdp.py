"""FSDP2 wrapping of Hugging Face models: one ``fully_shard`` group per decoder layer plus the root.

- Mixed precision on CUDA: parameters gathered in ``model.dtype`` (bf16/fp16), gradients reduced in fp32, master
  weights and optimizer state in fp32. On CPU everything is fp32 (no fast bf16 on common CPUs).
- ``fsdp.paramOffload``: FSDP2's ``CPUOffloadPolicy``: parameters, gradients and the AdamW state live on CPU and
  the optimizer step runs there, so it covers ``fsdp.optimizerOffload`` too. ``optimizerOffload`` alone keeps the
  AdamW moments in host memory between updates and brings them to the GPU for the update (``optimizer_state_on``).
- Decoder layers (:func:`wrap_decoder_layers`): ``model.compile`` on CUDA puts each layer's ``forward`` through
  ``torch.compile`` (at small micro-batches the eager update is bound by kernel launches: 34k per SmolLM2 update in
  micro-batches of 8 rows); gradient checkpointing wraps that forward in PyTorch's non-reentrant checkpoint. FSDP's
  hooks on the layer stay outside both, so they are neither compiled nor run again by the recompute.
- A single CPU rank is left unwrapped (FSDP would only add DTensor overhead: ~0.1–0.3 s per AdamW step on a tiny
  model); every code path (state dicts, weight sync, gradient clipping) treats both forms alike.
- LoRA: peft adapters on the ``targetModules``; the base weights are frozen, so the reference policy is the same
  model under ``disable_adapter()`` and costs no extra memory. The rollout receives merged weights
  ``W + (alpha/r)·B·A`` under the base model's names.

FSDP1 is not used: on CPU it fails without an accelerator ("FSDP needs a non-CPU accelerator device"), and
with ``device_id=cpu`` its gradient-norm clip differs per rank and its full-state-dict offload crashes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
LORA_PREFIX = "base_model.model."


def compute_dtype(dtype: str, device_type: str) -> torch.dtype:
    """The dtype forward passes run in: the spec's on CUDA, fp32 on CPU."""
    return DTYPES[dtype] if device_type == "cuda" else torch.float32


def base_model(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks named by the model's ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``)."""
    names = set(getattr(base_model(model), "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(base_model(model)).__name__} declares no decoder-layer class (_no_split_modules); "
            "cannot shard it layer by layer"
        )
    return layers


def apply_lora(model: nn.Module, *, rank: int, alpha: int, target_modules: list[str]) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = "all-linear" if target_modules == ["all-linear"] else list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    return get_peft_model(model, config)


def wrap_decoder_layers(model: nn.Module, *, compile_layers: bool, checkpointing: bool) -> None:
    """Replace each decoder layer's ``forward`` (not the module's call, whose hooks stay outside) by the compiled
    forward, inside a gradient checkpoint when ``checkpointing``.

    Compiled shapes are dynamic from the first call, since every packed micro-batch has its own length. The checkpoint
    is PyTorch's own rather than transformers' ``gradient_checkpointing_enable``: that one puts the checkpoint inside
    the forward, where dynamo gives up on the whole layer at a side effect (with transformers 5 and the ``kernels``
    package: a context variable set inside the checkpoint; no graph compiled), while a compiled forward inside a
    checkpoint is compiled, and recomputed like any other function.
    """
    for layer in decoder_layers(model):
        forward = layer.forward
        if compile_layers:
            forward = torch.compile(forward, dynamic=True)
        layer.forward = checkpointed(forward) if checkpointing else forward


def checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` under non-reentrant activation checkpointing when gradients are recorded, plain otherwise."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    return run


def shard(
    model: nn.Module, *, device_type: str, dtype: str, reshard_after_forward: bool = True, param_offload: bool = False
) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root (embeddings, final norm, output head).

    The mesh is built for ``device_type`` explicitly, so a CPU run on a machine that has a GPU stays on CPU.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"reshard_after_forward": reshard_after_forward, "mesh": mesh}
    param_dtype = compute_dtype(dtype, device_type)
    if param_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    kwargs["offload_policy"] = (
        CPUOffloadPolicy(pin_memory=True) if param_offload and device_type == "cuda" else OffloadPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def prepare(
    model: nn.Module,
    *,
    device: torch.device,
    dtype: str,
    gradient_checkpointing: bool,
    reshard_after_forward: bool,
    param_offload: bool,
    compile_layers: bool = False,
    trainable: bool = True,
    lora: dict[str, Any] | None = None,
) -> nn.Module:
    """LoRA, compilation and checkpointing of the decoder layers, and sharding, in the order they must be applied;
    ``model`` arrives in fp32 on CPU."""
    if lora is not None:
        model = apply_lora(model, **lora)
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    checkpointing = gradient_checkpointing and trainable
    if compile_layers or checkpointing:
        wrap_decoder_layers(model, compile_layers=compile_layers, checkpointing=checkpointing)
    if device.type == "cuda" and not param_offload:
        model.to(device)
    import torch.distributed as dist

    if device.type == "cpu" and (not dist.is_initialized() or dist.get_world_size() == 1):
        return model  # one CPU rank: nothing to shard, and DTensor bookkeeping would triple the optimizer step
    return shard(
        model,
        device_type=device.type,
        dtype=dtype,
        reshard_after_forward=reshard_after_forward,
        param_offload=param_offload,
    )


def full_tensor(t: Tensor) -> Tensor:
    """The whole tensor: a collective when ``t`` is a DTensor over several ranks (every rank must call it in the same
    order). Over one rank its local tensor already is the whole one, shared, not copied: the gather alone took 0.09 ms
    a parameter on an H100, 2.8x the local read and cast (bench/weight_gather.py)."""
    if not isinstance(t, DTensor):
        return t
    return t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()


def full_named_parameters(model: nn.Module, *, lora_scaling: float | None = None) -> Iterator[tuple[str, Tensor]]:
    """Every parameter gathered from its shards, under the plain Hugging Face name; LoRA adapters merged.

    Tied weights appear once (``named_parameters`` de-duplicates), so a tied output head is not sent twice. Detached
    after the gather: ``detach()`` of a DTensor goes through its dispatch, several times the one-rank local read
    itself (bench/weight_gather.py, ``local`` against ``local_detached_first``).
    """
    if lora_scaling is None:
        for name, param in model.named_parameters():
            yield name, full_tensor(param).detach()
        return
    full = {name: full_tensor(param).detach() for name, param in model.named_parameters()}
    yield from merge_lora(full, lora_scaling).items()


def merge_lora(full: dict[str, Tensor], lora_scaling: float) -> dict[str, Tensor]:
    """A peft state dict → the base model's names with ``W + scaling·B·A`` merged in (used by export too)."""
    merged: dict[str, Tensor] = {}
    for name, tensor in full.items():
        if ".lora_" in name:
            continue
        plain = name.removeprefix(LORA_PREFIX)
        if ".base_layer." in name:
            module = name.split(".base_layer.")[0]
            plain = plain.replace(".base_layer.", ".")
            if name.endswith(".weight") and f"{module}.lora_A.default.weight" in full:
                a = full[f"{module}.lora_A.default.weight"]
                b = full[f"{module}.lora_B.default.weight"]
                tensor = tensor + lora_scaling * (b.to(tensor.dtype) @ a.to(tensor.dtype))
        merged[plain] = tensor
    return merged


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm over all shards; returns the norm before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(full_tensor(norm))


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Skip the reduce-scatter on all but the last micro-batch of a gradient-accumulation window."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


@contextlib.contextmanager
def optimizer_state_on(optimizer: torch.optim.Optimizer, device: torch.device, offload: bool) -> Iterator[None]:
    """``optimizerOffload``: the AdamW moments live in host memory between updates and visit ``device`` only for
    the update itself (state created by the first step is moved out after it)."""
    if offload:
        _move_optimizer_state(optimizer, device)
    try:
        yield
    finally:
        if offload:
            _move_optimizer_state(optimizer, torch.device("cpu"))


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to(device, non_blocking=True)


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; on CUDA its fused kernel, one pass over parameters, gradients and moments
    (the default ``foreach`` form moves about three times the bytes: an estimated 10 ms against 3.5 ms a step for
    Qwen2-0.5B's float32 state on an H200)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), fused=fused or None)


def make_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, kind: str, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then constant or cosine decay to ``min_lr_ratio``·lr; stepped once per training step."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
