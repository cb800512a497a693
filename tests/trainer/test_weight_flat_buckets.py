"""A bucket of the weight stream packed into one buffer (weight_sync.FlatBucket) and read back as views."""

import pytest
import torch

from kuberl.trainer.rollout.weight_sync import bucketed, flatten


def weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(7, 4, generator=g)),
        ("model.layers.0.input_layernorm.weight", torch.randn(4, generator=g)),
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(4, 4, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(2, 3, 4, generator=g)),
        ("scalar", torch.tensor(3.5)),
    ]


def test_flatten_then_views_round_trips_names_shapes_and_values():
    named = weights()
    flat = flatten(named)
    assert flat.buffer.dim() == 1 and flat.buffer.numel() == sum(t.numel() for _, t in named)
    back = flat.tensors()
    assert [n for n, _ in back] == [n for n, _ in named]
    for (_, original), (_, view) in zip(named, back, strict=True):
        assert view.shape == original.shape and torch.equal(view, original)
        assert view.untyped_storage().data_ptr() == flat.buffer.untyped_storage().data_ptr()  # a view, no copy


def test_flatten_casts_once_to_the_wire_dtype():
    named = weights()
    back = flatten(named, dtype=torch.bfloat16).tensors()
    for (_, original), (_, view) in zip(named, back, strict=True):
        assert view.dtype == torch.bfloat16
        assert torch.equal(view, original.to(torch.bfloat16))


def test_mixed_source_dtypes_are_cast_each_before_packing():
    named = [("a", torch.ones(2, dtype=torch.float32)), ("b", torch.full((3,), 2.0, dtype=torch.bfloat16))]
    flat = flatten(named, dtype=torch.float16)
    assert flat.buffer.dtype == torch.float16 and flat.buffer.tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]


def test_every_bucket_of_a_stream_round_trips():
    named = weights()
    buckets = list(bucketed(named, bucket_bytes=80))
    assert len(buckets) > 1
    back = [pair for bucket in buckets for pair in flatten(bucket).tensors()]
    assert [n for n, _ in back] == [n for n, _ in named]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(back, named, strict=True))


def test_an_empty_bucket_is_refused():
    with pytest.raises(ValueError, match="empty bucket"):
        flatten([])
