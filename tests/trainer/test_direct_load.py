"""Weight loads replayed from vLLM's first load (kuberl.trainer.rollout.direct_load).

vLLM does not run on this machine, so the model here loads the way vLLM 0.26's loaders do for an unquantized model
on one GPU, as read in its source: q, k and v narrowed into one fused ``qkv_proj`` (``load_qkv_weight``), the
vocabulary copied into the first rows of a padded embedding and the rest filled with zeros
(``VocabParallelEmbedding.weight_loader``), everything else one ``copy_`` (``default_weight_loader``). The GPU run of
bench/weight_sync.py checks the replay against vLLM's own loader on a real engine (``direct_equals_loader``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from kuberl.trainer.rollout.direct_load import LoadPlan, LoadRecorder
from kuberl.trainer.rollout.weight_sync import bucketed, flatten

VOCAB, PADDED, HIDDEN, KV = 10, 16, 8, 4
Loader = Callable[["VllmLike", str, Tensor], None]


def fused_loader(model: VllmLike, name: str, tensor: Tensor) -> None:
    """vLLM's way: the shard's rows of the fused parameter, the padded vocabulary, a plain copy."""
    shards = {"q_proj": (0, HIDDEN), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN + KV, KV)}
    part = name.split(".")[-2]
    if part in shards:
        offset, rows = shards[part]
        model.qkv.data.narrow(0, offset, rows).copy_(tensor.narrow(0, 0, rows))
    elif name == "embed.weight":
        model.embed[: tensor.shape[0]].data.copy_(tensor)
        model.embed[tensor.shape[0] :].data.fill_(0)
    else:
        model.norm.data.copy_(tensor)


class VllmLike(nn.Module):
    """Parameters laid out as vLLM lays them out (fused, padded), loaded by ``loader`` one tensor at a time."""

    def __init__(self, loader: Loader = fused_loader, norm_dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.qkv = nn.Parameter(torch.zeros(HIDDEN + 2 * KV, HIDDEN, dtype=torch.bfloat16))
        self.embed = nn.Parameter(torch.zeros(PADDED, HIDDEN, dtype=torch.bfloat16))
        self.norm = nn.Parameter(torch.zeros(HIDDEN, dtype=norm_dtype))
        self.loader = loader

    def load_weights(self, weights: list[tuple[str, Tensor]]) -> None:
        for name, tensor in weights:
            self.loader(self, name, tensor)


def hf_weights(seed: int) -> list[tuple[str, Tensor]]:
    """The trainer's side: Hugging Face names, float32 masters."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {
        "embed.weight": (VOCAB, HIDDEN),
        "layer.q_proj.weight": (HIDDEN, HIDDEN),
        "layer.k_proj.weight": (KV, HIDDEN),
        "layer.v_proj.weight": (KV, HIDDEN),
        "norm.weight": (HIDDEN,),
    }
    return [(name, torch.randn(shape, generator=gen)) for name, shape in shapes.items()]


def first_load(model: VllmLike, bucket_bytes: int = 200) -> LoadRecorder:
    """What VLLMRollout.update_weights does the first time: buckets cast to bf16, vLLM's loader, recorded."""
    recorder = LoadRecorder()
    for bucket in bucketed(hf_weights(0), bucket_bytes):
        recorder.load(model, flatten(bucket, dtype=torch.bfloat16).tensors())
    return recorder


def loaded_by_vllm(weights: list[tuple[str, Tensor]], norm_dtype: torch.dtype = torch.bfloat16) -> dict[str, Tensor]:
    model = VllmLike(norm_dtype=norm_dtype)
    model.load_weights([(name, tensor.to(torch.bfloat16)) for name, tensor in weights])
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def refusal(loader: Loader) -> str | None:
    """Why the first load through ``loader`` is not replayed: no plan, and the recorder's reason."""
    model = VllmLike(loader)
    recorder = first_load(model)
    assert recorder.plan(model) is None
    return recorder.refused


def test_the_replay_puts_every_tensor_where_vllms_loader_puts_it() -> None:
    model = VllmLike()
    recorder = first_load(model)
    plan = recorder.plan(model)
    assert recorder.refused is None and plan is not None
    assert {name: len(targets) for name, targets in plan.copies.items()} == {name: 1 for name, _ in hf_weights(0)}
    with torch.no_grad():  # what a level-2 sleep leaves: the weight memory holds anything
        for p in model.parameters():
            p.fill_(float("nan"))
    new = hf_weights(1)
    plan.load(new)
    expected = loaded_by_vllm(new)
    for name, p in model.named_parameters():
        assert torch.equal(p, expected[name]), name


def test_a_parameter_kept_in_float32_gets_the_rollout_dtypes_rounding_as_from_vllms_loader() -> None:
    model = VllmLike(norm_dtype=torch.float32)
    plan = first_load(model).plan(model)
    assert plan is not None and plan.dtype == torch.bfloat16
    new = hf_weights(1)
    plan.load(new)
    assert torch.equal(model.norm, loaded_by_vllm(new, torch.float32)["norm"])
    assert not torch.equal(model.norm, dict(new)["norm.weight"])  # the float32 master itself would differ


def test_one_bucket_or_many_record_the_same_plan() -> None:
    model, one = VllmLike(), VllmLike()
    many = first_load(model, bucket_bytes=64).plan(model)
    single = first_load(one, bucket_bytes=2**20).plan(one)
    assert many is not None and single is not None
    assert many.copies.keys() == single.copies.keys() and len(many.fills) == len(single.fills) == 1


def test_a_loader_that_changes_the_values_after_copying_is_not_replayed() -> None:
    def scaling(model: VllmLike, name: str, tensor: Tensor) -> None:
        fused_loader(model, name, tensor)
        if name == "norm.weight":
            model.norm.data.mul_(2)

    assert refusal(scaling) == "'norm.weight' landed changed (the loader transforms it after the copy)"


def test_a_parameter_the_loader_leaves_unwritten_is_not_replayed() -> None:
    def skips_norm(model: VllmLike, name: str, tensor: Tensor) -> None:
        if name != "norm.weight":
            fused_loader(model, name, tensor)

    assert refusal(skips_norm) == "parameter norm: 8 elements no copy or fill wrote, 0 written twice"


def test_a_copy_of_part_of_a_tensor_is_not_replayed() -> None:
    def tensor_parallel(model: VllmLike, name: str, tensor: Tensor) -> None:
        if name == "layer.q_proj.weight":  # one rank's half, as with tensorParallelSize 2
            model.qkv.data.narrow(0, 0, HIDDEN // 2).copy_(tensor.narrow(0, 0, HIDDEN // 2))
        else:
            fused_loader(model, name, tensor)

    assert refusal(tensor_parallel) == "the loader copied (4, 8) from something other than a whole sent tensor"


def test_a_fill_with_a_value_is_not_replayed() -> None:
    def fills_one(model: VllmLike, name: str, tensor: Tensor) -> None:
        fused_loader(model, name, tensor)
        if name == "embed.weight":
            model.embed[VOCAB:].data.fill_(1.0)

    assert refusal(fills_one) == "the loader filled a region with 1.0, not zero"


def test_two_copies_into_the_same_rows_are_not_replayed_even_from_two_buckets() -> None:
    def overlapping(model: VllmLike, name: str, tensor: Tensor) -> None:
        fused_loader(model, name, tensor)
        if name == "layer.v_proj.weight":  # v also over k's rows, in the bucket after k's (k's own check passed)
            model.qkv.data.narrow(0, HIDDEN, KV).copy_(tensor)

    assert refusal(overlapping) == "parameter qkv: 0 elements no copy or fill wrote, 32 written twice"


@pytest.mark.parametrize(
    ("sent", "error"),
    [
        (lambda w: [*w, ("extra.weight", torch.zeros(2))], "'extra.weight' was not among the first load"),
        (lambda w: [*w, w[0]], "'embed.weight' was sent twice"),
        (lambda w: w[1:], "1 tensors of the first load were not sent: ['embed.weight']"),
        (lambda w: [*w[:-1], ("norm.weight", torch.ones(1))], "'norm.weight' is (1,), (8,) before"),
    ],
    ids=["unknown", "twice", "missing", "reshaped"],
)
def test_a_load_unlike_the_first_is_refused_by_name(
    sent: Callable[[list[tuple[str, Tensor]]], list[tuple[str, Tensor]]], error: str
) -> None:
    model = VllmLike()
    plan = first_load(model).plan(model)
    assert isinstance(plan, LoadPlan)
    with pytest.raises(RuntimeError, match=re.escape(error)):
        plan.load(sent(hf_weights(1)))
