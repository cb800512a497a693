import re
from pathlib import Path

import pytest

from kuberl.cli import main as cli_main
from kuberl.trainer.data.prompts import load_rows
from kuberl.trainer.data.tasks import (
    GSM8K_INSTRUCTION,
    digit_copy,
    gsm8k_synth,
    main_gsm8k_synth,
    write_rows,
)
from kuberl.trainer.rewards.functions import default, gsm8k

STEP = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>")
APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


def test_gsm8k_rows_follow_verls_schema() -> None:
    row = gsm8k_synth(1, seed=0, split="train")[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "kuberl/gsm8k-synth" and row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": f"{row['extra_info']['question']} {GSM8K_INSTRUCTION}"}]
    assert row["reward_model"]["style"] == "rule"
    assert set(row["extra_info"]) == {"split", "index", "question", "answer"}


def test_gsm8k_prompts_end_with_verls_instruction() -> None:
    assert gsm8k_synth(1, seed=0, split="train")[0]["prompt"][0]["content"].endswith(
        'Let\'s think step by step and output the final answer after "####".'
    )


def test_every_worked_step_is_correct_arithmetic() -> None:
    for row in gsm8k_synth(200, seed=1, split="train"):
        for a, op, b, result in STEP.findall(row["extra_info"]["answer"]):
            assert APPLY[op](int(a), int(b)) == int(result), row["extra_info"]["answer"]


def test_the_reference_answer_earns_the_gsm8k_reward() -> None:
    for row in gsm8k_synth(200, seed=2, split="train"):
        assert gsm8k(row["data_source"], row["extra_info"]["answer"], row["reward_model"]["ground_truth"]) == 1.0


def test_problems_have_the_requested_number_of_steps() -> None:
    counts = {len(STEP.findall(r["extra_info"]["answer"])) for r in gsm8k_synth(200, seed=0, split="t", steps=(2, 3))}
    assert counts == {2, 3}


def test_starting_amounts_stay_within_max_operand() -> None:
    for row in gsm8k_synth(200, seed=0, split="train", max_operand=9):
        assert 1 <= int(re.search(r"has (\d+)", row["extra_info"]["question"]).group(1)) <= 9


def test_generation_is_a_function_of_seed_and_split() -> None:
    assert gsm8k_synth(20, seed=0, split="train") == gsm8k_synth(20, seed=0, split="train")
    assert gsm8k_synth(20, seed=0, split="train") != gsm8k_synth(20, seed=0, split="test")
    assert gsm8k_synth(20, seed=0, split="train") != gsm8k_synth(20, seed=1, split="train")


def test_bad_arguments_are_refused_with_their_values() -> None:
    with pytest.raises(ValueError, match=r"steps=\(3, 1\)"):
        gsm8k_synth(1, seed=0, split="train", steps=(3, 1))


def test_digit_prompts_ask_for_their_ground_truth() -> None:
    for row in digit_copy(50, seed=0, split="train"):
        digit = row["reward_model"]["ground_truth"]
        assert row["prompt"][0]["content"] == f"Answer with the digit {digit}."
        assert row["data_source"] == "kuberl/digits" and row["extra_info"]["answer"] == digit


def test_digit_prompts_cover_all_ten_digits() -> None:
    assert {r["reward_model"]["ground_truth"] for r in digit_copy(200, seed=0, split="train")} == set("0123456789")


def test_the_default_reward_scores_a_digit_answer_by_its_first_character() -> None:
    row = digit_copy(1, seed=0, split="train")[0]
    digit = row["reward_model"]["ground_truth"]
    assert default(row["data_source"], f" {digit}q#", digit, row["extra_info"]) == 1.0
    assert default(row["data_source"], f"q{digit}", digit, row["extra_info"]) == 0.0


def test_write_rows_refuses_other_suffixes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.parquet or \.jsonl, not '\.csv'"):
        write_rows([], str(tmp_path / "d.csv"))


def test_main_gsm8k_synth_writes_loadable_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "train.parquet"
    main_gsm8k_synth(str(out), 5, 0, "train")
    assert load_rows([str(out)]) == gsm8k_synth(5, seed=0, split="train")
    assert "wrote 5 rows" in capsys.readouterr().out


def test_main_gsm8k_synth_passes_the_problem_shape_through(tmp_path: Path) -> None:
    out = tmp_path / "small.jsonl"
    main_gsm8k_synth(str(out), 20, 0, "train", max_operand=10, steps=(1, 1))
    assert load_rows([str(out)]) == gsm8k_synth(20, seed=0, split="train", max_operand=10, steps=(1, 1))


def test_the_data_command_shapes_gsm8k_problems_with_max_operand_and_steps(tmp_path: Path) -> None:
    out = tmp_path / "small.jsonl"
    assert (
        cli_main(
            ["data", "gsm8k-synth", "--output-file", str(out), "--n", "20", "--max-operand", "10", "--steps", "1", "1"]
        )
        == 0
    )
    assert load_rows([str(out)]) == gsm8k_synth(20, seed=0, split="train", max_operand=10, steps=(1, 1))


def test_the_data_command_refuses_an_invalid_problem_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["data", "gsm8k-synth", "--output-file", str(tmp_path / "d.jsonl"), "--steps", "3", "1"]) == 1
    assert "steps=(3, 1)" in capsys.readouterr().err


def test_the_data_command_refuses_gsm8k_options_for_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["data", "digits", "--output-file", str(tmp_path / "d.jsonl"), "--max-operand", "10"]) == 1
    assert "digits task takes neither" in capsys.readouterr().err
