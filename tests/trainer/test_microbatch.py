"""Micro-batching: fixed and token-budget splits, trimming, and the per-rank mini-batch shards."""

import pytest
import torch

from kuberl.api import parse_spec, plan_batches
from kuberl.trainer.model.microbatch import (
    bin_cost,
    concat,
    equalize,
    largest_first,
    micro_batches,
    model_inputs,
    shard_mini_batches,
    split_by_tokens,
    split_fixed,
    trim,
)


def make_rows(prompt_lens: list[int], response_lens: list[int], p: int = 8, r: int = 6) -> dict[str, torch.Tensor]:
    n = len(prompt_lens)
    prompts = torch.zeros(n, p, dtype=torch.long)
    prompt_mask = torch.zeros(n, p, dtype=torch.long)
    responses = torch.zeros(n, r, dtype=torch.long)
    response_mask = torch.zeros(n, r, dtype=torch.long)
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompts[i, p - pl :] = torch.arange(1, pl + 1)
        prompt_mask[i, p - pl :] = 1
        responses[i, :rl] = torch.arange(10, 10 + rl)
        response_mask[i, :rl] = 1
    return {
        "prompts": prompts,
        "prompt_mask": prompt_mask,
        "responses": responses,
        "response_mask": response_mask,
        "advantages": torch.randn(n, r),
    }


def spec_dict(**batch) -> dict:
    return {
        "model": {"path": "tiny://llama"},
        "algorithm": {"advantageEstimator": "grpo"},
        "data": {"trainFiles": ["x.parquet"], "maxPromptLength": 8, "maxResponseLength": 6},
        "rollout": {"engine": "hf"},
        "batch": {"trainBatchSize": 8, "rolloutN": 4, "ppoMiniBatchSize": 4, **batch},
        "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 2}},
    }


def test_fixed_micro_batches_give_plan_batches_gradient_accumulation():
    spec = parse_spec(spec_dict(ppoMicroBatchSizePerGPU=2))
    plan = plan_batches(spec)
    rows = make_rows([3] * 32, [2] * 32)
    shards = shard_mini_batches(
        rows, mini_batch_rows=spec.batch.ppo_mini_batch_size * spec.batch.rollout_n, dp=plan.trainer_gpus
    )
    assert len(shards) == plan.trainer_gpus
    for rank_minis in shards:
        assert len(rank_minis) == plan.mini_batches_per_step
        for mini in rank_minis:
            assert mini["responses"].shape[0] == plan.rows_per_gpu_per_mini_batch
            bins = micro_batches(mini, micro_batch_size=plan.micro_batch_size_per_gpu, max_tokens=None)
            assert len(bins) == plan.gradient_accumulation_steps
            assert all(len(b) == plan.micro_batch_size_per_gpu for b in bins)


def test_mini_batches_are_consecutive_rows_split_over_ranks():
    rows = make_rows([1] * 8, [1] * 8)
    rows["prompts"][:, -1] = torch.arange(8)
    shards = shard_mini_batches(rows, mini_batch_rows=4, dp=2)
    assert [m["prompts"][:, -1].tolist() for m in shards[0]] == [[0, 1], [4, 5]]
    assert [m["prompts"][:, -1].tolist() for m in shards[1]] == [[2, 3], [6, 7]]


def test_split_fixed_covers_every_row_once():
    assert split_fixed(5, 2) == [[0, 1], [2, 3], [4]]


def test_dynamic_micro_batches_respect_the_token_budget():
    prompt_lens = [8, 2, 3, 7, 1, 5, 4, 6]
    response_lens = [6, 1, 6, 2, 3, 4, 1, 5]
    bins = split_by_tokens(prompt_lens, response_lens, max_tokens=24)
    assert sorted(i for b in bins for i in b) == list(range(8))
    for b in bins:
        assert bin_cost([prompt_lens[i] for i in b], [response_lens[i] for i in b]) <= 24


def test_dynamic_micro_batches_pack_short_rows_together():
    bins = split_by_tokens([2] * 8, [2] * 8, max_tokens=16)
    assert len(bins) == 2 and all(len(b) == 4 for b in bins)


def test_a_row_over_the_budget_gets_its_own_micro_batch():
    bins = split_by_tokens([10, 1], [10, 1], max_tokens=5)
    assert sorted(bins) == [[0], [1]]


def test_dynamic_micro_batches_from_rows_use_real_lengths():
    rows = make_rows([8, 1, 1, 1], [6, 1, 1, 1])
    bins = micro_batches(rows, micro_batch_size=None, max_tokens=14)
    assert [0] in bins and sum(len(b) for b in bins) == 4 and len(bins) == 2


def test_a_step_runs_its_largest_micro_batch_first():
    # the benchmark's step 4 at a 60,416-token budget packed [27,720, 60,352] by first row; the smaller one ran
    # first and the larger reserved 13.7 GiB of new segments (docs/performance.md)
    rows = make_rows([1, 8, 8, 2, 1], [1, 6, 6, 2, 1])  # 2, 14, 14, 4, 2 tokens
    assert split_by_tokens([1, 8, 8, 2, 1], [1, 6, 6, 2, 1], max_tokens=15) == [[0, 3, 4], [1], [2]]
    assert micro_batches(rows, micro_batch_size=None, max_tokens=15) == [[1], [2], [0, 3, 4]]
    fixed = micro_batches(rows, micro_batch_size=2, max_tokens=None)  # 16, 18 and 2 tokens
    assert fixed == [[2, 3], [0, 1], [4]]


def test_largest_first_keeps_ties_in_order_and_puts_empty_micro_batches_last():
    rows = make_rows([2, 2, 3, 1], [2, 2, 3, 1])
    assert largest_first(rows, [[], [0], [3], [1], [2]]) == [[2], [0], [1], [3], []]


def test_equalize_splits_the_largest_micro_batch_first():
    assert equalize([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]


def test_equalize_appends_empty_micro_batches_when_rows_run_out():
    assert equalize([[0]], 3) == [[0], [], []]


def test_trim_drops_padding_columns_and_keeps_alignment():
    rows = make_rows([2, 3], [1, 4])
    trimmed = trim(rows)
    assert trimmed["prompts"].shape == (2, 3) and trimmed["responses"].shape == (2, 4)
    assert trimmed["advantages"].shape == (2, 4)
    assert torch.equal(trimmed["prompts"][1], torch.tensor([1, 2, 3]))


def test_model_inputs_positions_start_at_zero_after_left_padding():
    _, attention_mask, position_ids = model_inputs(trim(make_rows([2, 3], [2, 2])))
    assert attention_mask[0].tolist() == [0, 1, 1, 1, 1]
    assert position_ids[0].tolist() == [0, 0, 1, 2, 3]
    assert position_ids[1].tolist() == [0, 1, 2, 3, 4]


def test_concat_repads_prompts_left_and_responses_right():
    a = trim(make_rows([2], [1]))
    b = trim(make_rows([4], [3]))
    rows = concat([a, b], pad_id=0)
    assert rows["prompts"].shape == (2, 4) and rows["responses"].shape == (2, 3)
    assert rows["prompt_mask"][0].tolist() == [0, 0, 1, 1]
    assert rows["response_mask"][0].tolist() == [1, 0, 0]


def test_shard_mini_batches_refuses_rows_that_do_not_divide():
    with pytest.raises(ValueError, match="do not split"):
        shard_mini_batches(make_rows([1] * 6, [1] * 6), mini_batch_rows=4, dp=2)


def test_a_token_budget_counts_real_tokens_as_the_packed_pass_sees_them():
    # padded, rows of 8 + 1 and 1 + 8 tokens would cost 2 × (8 + 8) = 32; packed they are 9 + 9
    assert bin_cost([8, 1], [1, 8]) == 18
    assert split_by_tokens([8, 1], [1, 8], max_tokens=18) == [[0, 1]]
