import json
import os
from pathlib import Path
from typing import Any

import pytest

from kuberl.trainer.data.prompts import (
    DataError,
    Prompt,
    PromptDataset,
    PromptLoader,
    load_rows,
    load_rows_with_origins,
)
from kuberl.trainer.data.tasks import write_rows
from kuberl.trainer.model.loading import load_tokenizer

os.environ["HF_HUB_OFFLINE"] = "1"
TOKENIZER = load_tokenizer("tiny://llama")


def row(content: str = "What is 1+2?", ground_truth: Any = "3", **extra: Any) -> dict[str, Any]:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": "train", "index": 0, **extra},
    }


def dataset(n: int, max_prompt_length: int = 1000) -> PromptDataset:
    return PromptDataset(
        [row(f"q{i}") for i in range(n)], TOKENIZER, max_prompt_length=max_prompt_length, filter_overlong=True
    )


def indices(batches: list[list[Prompt]]) -> list[list[int]]:
    return [[p.index for p in batch] for batch in batches]


# load_rows


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_load_rows_reads_what_write_rows_wrote(tmp_path: Path, suffix: str) -> None:
    rows = [row("a", answer="#### 3"), row("b", answer="#### 4")]
    assert load_rows([str(write_rows(rows, str(tmp_path / f"d{suffix}")))]) == rows


def test_load_rows_reads_a_json_list(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text(json.dumps([row()]))
    assert load_rows([str(tmp_path / "d.json")]) == [row()]


def test_load_rows_concatenates_files_in_order(tmp_path: Path) -> None:
    write_rows([row("a")], str(tmp_path / "1.jsonl"))
    write_rows([row("b")], str(tmp_path / "2.parquet"))
    rows = load_rows([str(tmp_path / "1.jsonl"), str(tmp_path / "2.parquet")])
    assert [r["prompt"][0]["content"] for r in rows] == ["a", "b"]


def test_a_missing_column_names_the_file_row_and_column(tmp_path: Path) -> None:
    broken = row()
    del broken["data_source"]
    path = write_rows([row(), broken], str(tmp_path / "d.jsonl"))
    with pytest.raises(DataError, match=rf"{path} row 1: missing column 'data_source'"):
        load_rows([str(path)])


def test_a_custom_prompt_key_is_required_instead_of_prompt(tmp_path: Path) -> None:
    path = write_rows([row()], str(tmp_path / "d.jsonl"))
    with pytest.raises(DataError, match="missing column 'question'"):
        load_rows([str(path)], prompt_key="question")


def test_a_rule_reward_without_ground_truth_is_an_error(tmp_path: Path) -> None:
    path = write_rows([row(ground_truth=None)], str(tmp_path / "d.jsonl"))
    with pytest.raises(DataError, match=r"row 0: reward_model needs a 'ground_truth'"):
        load_rows([str(path)])


def test_invalid_jsonl_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row()) + "\n{not json\n")
    with pytest.raises(DataError, match=rf"{path}:2: not valid JSON"):
        load_rows([str(path)])


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"absent\.parquet: data file does not exist"):
        load_rows([str(tmp_path / "absent.parquet")])


def test_an_unsupported_suffix_lists_the_supported_ones(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"'\.csv'.*\.parquet"):
        load_rows([str(tmp_path / "d.csv")])


# PromptDataset


def test_prompts_are_the_chat_template_with_generation_prompt_tokenized() -> None:
    prompt = dataset(1)[0]
    assert TOKENIZER.decode(prompt.input_ids) == "<|im_start|>user\nq0<|im_end|>\n<|im_start|>assistant\n"


def test_prompts_carry_source_ground_truth_extra_info_index_and_raw_chat() -> None:
    prompt = PromptDataset(
        [row(), row("x", ground_truth=42, answer="#### 42")], TOKENIZER, max_prompt_length=100, filter_overlong=False
    )[1]
    assert (prompt.data_source, prompt.ground_truth, prompt.index) == ("openai/gsm8k", "42", 1)
    assert prompt.extra_info == {"split": "train", "index": 0, "answer": "#### 42"}
    assert prompt.raw_prompt == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(("value", "text"), [(0, "0"), (0.0, "0.0"), (-3, "-3"), ("0", "0"), (False, "False")])
def test_numeric_ground_truths_keep_their_string_form(value: Any, text: str) -> None:
    prompt = PromptDataset([row(ground_truth=value)], TOKENIZER, max_prompt_length=100, filter_overlong=False)[0]
    assert prompt.ground_truth == text


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_numeric_ground_truth_0_read_from_a_file_scores(tmp_path: Path, suffix: str) -> None:
    """An int64 ground_truth column (parquet) or a JSON number: 0 must score "#### 0", not become ""."""
    from kuberl.trainer.rewards.functions import RewardInput, gsm8k
    from kuberl.trainer.rewards.scoring import score_batch

    path = write_rows([row(ground_truth=0), row(ground_truth=7)], str(tmp_path / f"d{suffix}"))
    prompts = PromptDataset(load_rows([str(path)]), TOKENIZER, max_prompt_length=100, filter_overlong=False)
    inputs = [RewardInput(p.data_source, "so\n#### 0", p.ground_truth, p.extra_info) for p in prompts]
    assert [o.score for o in score_batch(gsm8k, inputs)] == [1.0, 0.0]


def test_overlong_prompts_are_filtered_and_counted_keeping_row_indices() -> None:
    template = len(
        TOKENIZER.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, tokenize=False)
    )
    rows = [row("a" * 5), row("a" * 50), row("a" * 10)]
    data = PromptDataset(rows, TOKENIZER, max_prompt_length=template + 10, filter_overlong=True)
    assert data.num_filtered == 1
    assert [p.index for p in data] == [0, 2]


def test_an_overlong_prompt_without_filtering_names_the_row_and_lengths() -> None:
    with pytest.raises(DataError, match=r"row 1: prompt is \d+ tokens .* maxPromptLength 40"):
        PromptDataset([row("a"), row("a" * 60)], TOKENIZER, max_prompt_length=40, filter_overlong=False)


def test_an_overlong_prompt_names_its_file_and_row(tmp_path: Path) -> None:
    first = write_rows([row("a")], str(tmp_path / "short.jsonl"))
    second = write_rows([row("a"), row("a" * 60)], str(tmp_path / "long.parquet"))
    rows, origins = load_rows_with_origins([str(first), str(second)])
    with pytest.raises(DataError, match=rf"{second} row 1: prompt is \d+ tokens .* maxPromptLength 40"):
        PromptDataset(rows, TOKENIZER, max_prompt_length=40, filter_overlong=False, origins=origins)


def test_a_prompt_that_is_not_a_chat_list_is_an_error() -> None:
    bad = row()
    bad["prompt"] = "just a string"
    with pytest.raises(DataError, match=r"row 0: 'prompt' must be a non-empty chat list"):
        PromptDataset([bad], TOKENIZER, max_prompt_length=100, filter_overlong=True)


# PromptLoader


def test_loader_length_counts_full_batches_only() -> None:
    loader = PromptLoader(dataset(10), 4, seed=0)
    assert len(loader) == 2
    assert [len(b) for b in loader] == [4, 4]


def test_each_epoch_draws_distinct_prompts_in_a_new_order() -> None:
    loader = PromptLoader(dataset(12), 4, seed=0)
    first, second = indices(list(loader)), indices(list(loader))
    assert sorted(i for batch in first for i in batch) == list(range(12))
    assert first != second


def test_the_order_is_a_function_of_the_seed() -> None:
    assert indices(list(PromptLoader(dataset(12), 4, seed=5))) == indices(list(PromptLoader(dataset(12), 4, seed=5)))
    assert indices(list(PromptLoader(dataset(12), 4, seed=5))) != indices(list(PromptLoader(dataset(12), 4, seed=6)))


def test_without_shuffle_batches_follow_row_order() -> None:
    assert indices(list(PromptLoader(dataset(6), 3, seed=0, shuffle=False))) == [[0, 1, 2], [3, 4, 5]]


def test_state_counts_batches_handed_out_and_rolls_over_epochs() -> None:
    loader = PromptLoader(dataset(8), 4, seed=0)
    batches = iter(loader)
    next(batches)
    assert loader.state_dict() == {"epoch": 0, "batch_in_epoch": 1}
    list(batches)
    assert loader.state_dict() == {"epoch": 1, "batch_in_epoch": 0}


def test_resuming_from_state_continues_the_same_sequence_across_epochs() -> None:
    def run(loader: PromptLoader, steps: int) -> list[list[int]]:
        out = []
        while len(out) < steps:
            for batch in loader:
                out.append([p.index for p in batch])
                if len(out) == steps:
                    return out
        return out

    expected = run(PromptLoader(dataset(13), 3, seed=7), 10)
    interrupted = PromptLoader(dataset(13), 3, seed=7)
    head = run(interrupted, 6)
    resumed = PromptLoader(dataset(13), 3, seed=7)
    resumed.load_state_dict(interrupted.state_dict())
    assert head + run(resumed, 4) == expected


def test_a_state_saved_after_an_epochs_last_batch_resumes_at_the_next_epoch() -> None:
    loader = PromptLoader(dataset(8), 4, seed=1)
    loader.load_state_dict({"epoch": 0, "batch_in_epoch": 2})
    reference = PromptLoader(dataset(8), 4, seed=1)
    list(reference)
    assert indices(list(loader)) == [] and indices(list(loader)) == indices(list(reference))


def test_data_smaller_than_one_batch_names_the_numbers() -> None:
    with pytest.raises(
        DataError,
        match=r"holds 3 prompts \(0 overlong filtered\), fewer than one batch of "
        r"data.trainBatchSize=4",
    ):
        PromptLoader(dataset(3), 4, seed=0)


def test_a_state_past_the_epoch_is_refused() -> None:
    with pytest.raises(DataError, match="past the 2 batches per epoch"):
        PromptLoader(dataset(8), 4, seed=0).load_state_dict({"epoch": 0, "batch_in_epoch": 3})


def test_extra_draws_inside_the_epoch_loop_keep_one_sequence_and_resume_exactly() -> None:
    """The fit loop iterates the loader while dynamic sampling draws extra batches with next_batch: together they
    hand out the plain sequence once, across epoch ends, and the saved state resumes it."""
    plain = PromptLoader(dataset(13), 3, seed=7)
    expected = [[p.index for p in plain.next_batch()] for _ in range(11)]

    def run(loader: PromptLoader, draws: int) -> list[list[int]]:
        out: list[list[int]] = []
        while len(out) < draws:
            for batch in loader:
                out.append([p.index for p in batch])
                for _ in range(min(2, draws - len(out))):  # two extra rounds per step, crossing epoch ends
                    out.append([p.index for p in loader.next_batch()])
                if len(out) >= draws:
                    return out
        return out

    assert run(PromptLoader(dataset(13), 3, seed=7), 11) == expected
    interrupted = PromptLoader(dataset(13), 3, seed=7)
    head = run(interrupted, 6)
    resumed = PromptLoader(dataset(13), 3, seed=7)
    resumed.load_state_dict(interrupted.state_dict())
    assert head + run(resumed, 5) == expected
