"""Gradient checkpointing of the decoder layers (fsdp.wrap_decoder_layers): the same log-probs and gradients as
without it, with the layers' activations dropped after the forward and recomputed in the backward; none under
no_grad, and the reference model (not trainable) is never checkpointed."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

from kuberl.trainer.model import fsdp
from kuberl.trainer.model.lm_head import packed_response_log_probs
from kuberl.trainer.model.microbatch import pack
from kuberl.trainer.workers.base import load_trainer_model
from kuberl.trainer.workers.critic import ValueModel

TINY = "tiny://llama?hidden=64&layers=3&heads=4&kv_heads=2&seed=0"
CPU = torch.device("cpu")
T = TypeVar("T")


def prepared(checkpointing: bool, *, trainable: bool = True, value_head: bool = False) -> nn.Module:
    model: nn.Module = load_trainer_model(TINY)
    if value_head:
        model = ValueModel(model)  # type: ignore[arg-type]
    return fsdp.prepare(
        model,
        device=CPU,
        dtype="float32",
        gradient_checkpointing=checkpointing,
        reshard_after_forward=True,
        param_offload=False,
        trainable=trainable,
    )


def rows() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(0)
    response_mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [1] * 7 + [0] * 2])
    return {
        "prompts": torch.randint(4, 60, (3, 6), generator=g),
        "prompt_mask": torch.ones(3, 6, dtype=torch.long),
        "responses": torch.randint(4, 60, (3, 9), generator=g) * response_mask,
        "response_mask": response_mask,
    }


def saved_for_backward(forward: Callable[[], T]) -> tuple[T, list[int]]:
    """``forward()``, and the bytes of each tensor autograd saved for the backward while it ran."""
    saved: list[int] = []

    def pack_hook(t: Tensor) -> Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        return forward(), saved


def log_probs_and_saved_bytes(model: nn.Module) -> tuple[Tensor, int]:
    """Summed response log-probs, and the bytes autograd saved for the backward during the forward."""
    out, saved = saved_for_backward(
        lambda: packed_response_log_probs(model, pack(rows()), temperature=0.9, with_entropy=True, device=CPU)
    )
    return out["log_probs"].sum() + 0.1 * out["entropy"].sum(), sum(saved)


def test_checkpointed_layers_give_the_same_gradients_and_keep_fewer_activations() -> None:
    plain, checkpointed = prepared(False), prepared(True)
    loss_plain, saved_plain = log_probs_and_saved_bytes(plain)
    loss_checkpointed, saved_checkpointed = log_probs_and_saved_bytes(checkpointed)
    loss_plain.backward()
    loss_checkpointed.backward()
    torch.testing.assert_close(loss_checkpointed, loss_plain, rtol=0, atol=1e-6)
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert saved_checkpointed < saved_plain / 2, (saved_checkpointed, saved_plain)


def test_the_critics_value_model_is_checkpointed_too() -> None:
    packed = pack(rows())
    model, plain = prepared(True, value_head=True), prepared(False, value_head=True)
    values, saved = saved_for_backward(
        lambda: model(packed.input_ids, packed.position_ids, **packed.attention_kwargs())
    )
    values.sum().backward()
    _, plain_saved = saved_for_backward(
        lambda: plain(packed.input_ids, packed.position_ids, **packed.attention_kwargs())
    )
    assert len(saved) < len(plain_saved) / 2


def test_no_checkpoint_without_gradients_or_for_a_frozen_model() -> None:
    checkpointed = prepared(True)
    with torch.no_grad():
        recorded, _ = log_probs_and_saved_bytes(checkpointed)
    torch.testing.assert_close(recorded, log_probs_and_saved_bytes(prepared(False))[0].detach(), rtol=0, atol=1e-6)
    assert not any(inspect.ismethod(layer.forward) for layer in fsdp.decoder_layers(checkpointed))
    assert all(inspect.ismethod(layer.forward) for layer in fsdp.decoder_layers(prepared(True, trainable=False)))
