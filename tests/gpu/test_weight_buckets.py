"""Bucketing of the weight stream (weight_sync): pure tensor logic, so these run on CPU, in CI too."""

from __future__ import annotations

import torch

from kuberl.trainer.rollout.weight_sync import BroadcastGroup, bucketed, fsdp_param_metadata, rollout_named_tensors


def named(*sizes: int) -> list[tuple[str, torch.Tensor]]:
    return [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate(sizes)]


def test_buckets_hold_at_most_the_byte_budget_and_keep_order() -> None:
    buckets = list(bucketed(named(10, 10, 10, 5), bucket_bytes=80))
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2", "w3"]]


def test_a_tensor_larger_than_the_budget_travels_alone() -> None:
    buckets = list(bucketed(named(2, 100, 2), bucket_bytes=16))
    assert [[n for n, _ in b] for b in buckets] == [["w0"], ["w1"], ["w2"]]


def test_buckets_are_produced_lazily() -> None:
    seen = []

    def source():
        for name, t in named(4, 4, 4, 4):
            seen.append(name)
            yield name, t

    stream = bucketed(source(), bucket_bytes=32)
    first = next(stream)
    assert [n for n, _ in first] == ["w0", "w1"]
    assert seen == ["w0", "w1", "w2"]  # one look-ahead tensor, not the whole model


def test_tied_output_head_is_dropped_and_tensors_cast() -> None:
    stream = [("model.embed_tokens.weight", torch.ones(4, 2)), ("lm_head.weight", torch.ones(4, 2))]
    out = list(rollout_named_tensors(stream, tied=True, dtype=torch.bfloat16))
    assert [n for n, _ in out] == ["model.embed_tokens.weight"]
    assert out[0][1].dtype == torch.bfloat16
    assert [n for n, _ in rollout_named_tensors(stream, tied=False)] == ["model.embed_tokens.weight", "lm_head.weight"]


def test_metadata_matches_the_stream_names_for_a_tied_model() -> None:
    from transformers import AutoModelForCausalLM

    from kuberl.trainer.model.loading import build_tiny, parse_tiny

    model = build_tiny(
        parse_tiny("tiny://llama?hidden=16&layers=1&heads=2&kv_heads=1&tie=1"), AutoModelForCausalLM, torch.float32
    )
    metas = fsdp_param_metadata(model)
    streamed = [n for n, _ in rollout_named_tensors(model.named_parameters(), tied=True)]
    assert [m.name for m in metas] == streamed
    assert "lm_head.weight" not in streamed
    assert all(m.dtype == torch.bfloat16 for m in metas)


def test_broadcast_group_ranks_follow_the_trainer() -> None:
    group = BroadcastGroup("10.0.0.1", 29500, (2, 2, 1))
    assert group.world_size == 6
    assert [group.engine_init_info(i)["rank_offset"] for i in range(3)] == [1, 3, 5]
    assert group.engine_init_info(2)["world_size"] == 6
