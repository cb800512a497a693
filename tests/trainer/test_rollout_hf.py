"""The hf rollout: shapes, left padding, masks, n samples per prompt, eos handling, weight updates."""

import pytest
import torch

from kuberl.trainer.model.loading import load_causal_lm, load_tokenizer
from kuberl.trainer.rollout.base import RolloutBatch, left_pad, response_mask_from_eos
from kuberl.trainer.rollout.hf import HFRollout
from kuberl.trainer.rollout.registry import engine

TINY = "tiny://llama?hidden=32&layers=1&heads=2&kv_heads=1&seed=0"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY)


@pytest.fixture()
def rollout(tokenizer):
    model = load_causal_lm(TINY, torch.float32)
    return HFRollout(model, pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id])


def prompt_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_left_pad_puts_padding_before_the_prompt():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_response_mask_ends_at_the_first_eos_inclusive():
    mask = response_mask_from_eos(torch.tensor([[4, 3, 5, 3], [4, 4, 4, 4]]), eos_ids=[3])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_generate_returns_n_rows_per_prompt_with_matching_shapes(rollout, tokenizer):
    torch.manual_seed(0)
    prompts = [prompt_ids(tokenizer, "hello"), prompt_ids(tokenizer, "hi")]
    batch = rollout.generate(prompts, 3, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=5)
    assert isinstance(batch, RolloutBatch) and len(batch) == 6
    assert batch.prompts.shape == batch.prompt_mask.shape == (6, 5)
    assert batch.responses.shape == batch.response_mask.shape
    assert batch.responses.shape[1] <= 5
    # samples of a prompt are consecutive rows, and the short prompt is left-padded
    assert torch.equal(batch.prompts[0], batch.prompts[2])
    assert batch.prompt_mask[3].tolist() == [0, 0, 0, 1, 1]
    assert batch.prompts[3, :3].tolist() == [tokenizer.pad_token_id] * 3


def test_generation_stops_at_eos_and_pads_after_it(tokenizer):
    model = load_causal_lm(TINY, torch.float32)
    pad = tokenizer.pad_token_id
    free = HFRollout(model, pad_id=pad, eos_ids=[tokenizer.eos_token_id])
    prompts = [prompt_ids(tokenizer, "abc")]
    greedy = free.generate(prompts, 1, temperature=0.0, max_new_tokens=6).responses[0].tolist()
    stop = greedy[1]  # declare the second greedy token an eos: generation must end right there
    first = greedy.index(stop)
    stopping = HFRollout(model, pad_id=pad, eos_ids=[stop])
    batch = stopping.generate(prompts, 2, temperature=0.0, max_new_tokens=6)
    assert batch.responses.shape[1] == first + 1
    assert batch.responses[0].tolist() == greedy[: first + 1]
    assert batch.response_mask.sum(-1).tolist() == [first + 1, first + 1]


def test_rows_that_finish_early_are_padded_and_masked():
    mask = response_mask_from_eos(torch.tensor([[7, 3, 0, 0], [7, 7, 7, 3]]), eos_ids=[3])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_greedy_generation_is_identical_across_samples(rollout, tokenizer):
    batch = rollout.generate([prompt_ids(tokenizer, "xyz")], 3, temperature=0.0, max_new_tokens=4)
    assert torch.equal(batch.responses[0], batch.responses[1]) and torch.equal(batch.responses[1], batch.responses[2])


def test_update_weights_changes_what_is_generated(rollout, tokenizer):
    prompts = [prompt_ids(tokenizer, "abc")]
    before = rollout.generate(prompts, 1, temperature=0.0, max_new_tokens=3).responses
    target = tokenizer.convert_tokens_to_ids("7")
    head = torch.zeros_like(rollout.model.lm_head.weight)
    head[target] = 1.0
    bias = rollout.model.model.norm.weight
    rollout.update_weights([("lm_head.weight", head), ("model.norm.weight", torch.full_like(bias, 50.0))])
    after = rollout.generate(prompts, 1, temperature=0.0, max_new_tokens=3).responses
    assert not torch.equal(before, after)


def test_update_weights_refuses_unknown_names(rollout):
    with pytest.raises(KeyError, match="no tensor"):
        rollout.update_weights([("not.a.weight", torch.zeros(1))])


def test_rollout_log_probs_are_returned_when_asked(tokenizer):
    model = load_causal_lm(TINY, torch.float32)
    roll = HFRollout(model, pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id], calculate_log_probs=True)
    batch = roll.generate([prompt_ids(tokenizer, "q")], 2, temperature=1.0, max_new_tokens=3)
    assert batch.log_probs is not None and batch.log_probs.shape == batch.responses.shape
    assert (batch.log_probs <= 0).all()


def test_an_engine_without_factories_is_refused_by_name():
    with pytest.raises(
        ValueError, match="rollout engine 'sglang' has no factories in this process; registered: vllm, hf"
    ):
        engine("sglang")
