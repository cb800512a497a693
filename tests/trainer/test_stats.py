import os
from pathlib import Path

import pytest

from kuberl.trainer.data.lengths import format_report, length_stats, percentiles, suggest_lengths
from kuberl.trainer.data.prompts import PromptDataset, load_rows
from kuberl.trainer.data.tasks import digit_copy, gsm8k_synth, write_rows
from kuberl.trainer.model.loading import load_tokenizer

os.environ["HF_HUB_OFFLINE"] = "1"
TOKENIZER = load_tokenizer("tiny://llama")


def stats_of(answers: dict[str, int] | None = None, p99: int = 100) -> dict:
    stats = {"files": ["d.parquet"], "rows": 10, "prompt_tokens": {"p50": 1, "p90": 2, "p95": 3, "p99": p99, "max": 9}}
    if answers:
        stats |= {"answer_rows": 10, "answer_tokens": answers}
    return stats


def test_percentiles_are_nearest_rank() -> None:
    assert percentiles(list(range(1, 101))) == {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "max": 100}


def test_prompt_lengths_match_what_the_trainer_tokenizes(tmp_path: Path) -> None:
    path = str(write_rows(gsm8k_synth(50, seed=0, split="train"), str(tmp_path / "d.parquet")))
    lengths = sorted(
        len(p.input_ids)
        for p in PromptDataset(load_rows([path]), TOKENIZER, max_prompt_length=10**6, filter_overlong=False)
    )
    stats = length_stats([path], TOKENIZER, "prompt")
    assert stats["rows"] == 50
    assert stats["prompt_tokens"]["max"] == lengths[-1] and stats["prompt_tokens"]["p50"] == lengths[24]


def test_answer_lengths_count_the_reference_plus_an_end_token(tmp_path: Path) -> None:
    path = str(write_rows(digit_copy(5, seed=0, split="train"), str(tmp_path / "d.jsonl")))
    assert length_stats([path], TOKENIZER, "prompt")["answer_tokens"]["max"] == 2


def test_rows_without_reference_answers_have_no_answer_lengths(tmp_path: Path) -> None:
    rows = digit_copy(5, seed=0, split="train")
    for row in rows:
        del row["extra_info"]["answer"]
    stats = length_stats([str(write_rows(rows, str(tmp_path / "d.jsonl")))], TOKENIZER, "prompt")
    assert "answer_tokens" not in stats


@pytest.mark.parametrize(("p99", "suggested"), [(1, 64), (64, 64), (65, 128), (300, 320)])
def test_suggested_lengths_round_p99_up_to_a_multiple_of_64(p99: int, suggested: int) -> None:
    answers = {"p50": 1, "p90": 1, "p95": 1, "p99": p99, "max": 999}
    assert suggest_lengths(stats_of(answers, p99=p99)) == (suggested, suggested)


def test_no_response_length_is_suggested_without_reference_answers() -> None:
    assert suggest_lengths(stats_of()) == (128, None)


def test_report_shows_each_measure_and_the_suggested_spec_fields() -> None:
    report = format_report(stats_of({"p50": 10, "p90": 20, "p95": 30, "p99": 70, "max": 80}))
    assert "prompt" in report and "answer" in report
    assert "data.maxPromptLength: 128" in report and "data.maxResponseLength: 128" in report


def test_report_says_when_it_cannot_suggest_a_response_length() -> None:
    assert "data.maxResponseLength: no reference answers" in format_report(stats_of())
