"""`kuberl data code-synth`: programming tasks in verl's code-dataset schema whose reference solutions pass their own
tests in a real sandbox, scored by the code_tests reward as the trainer scores them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kuberl.cli import main as cli_main
from kuberl.sandbox.grading import cases_from_ground_truth
from kuberl.trainer.data.code_synth import CODE_SYNTH_SOURCE, FUNCTIONS, PROGRAMS, TESTS, code_synth
from kuberl.trainer.data.prompts import load_rows
from kuberl.trainer.rewards.functions import RewardInput
from kuberl.trainer.rewards.process import make_scorer
from kuberl.trainer.rewards.scoring import RewardPolicy
from tests.trainer.sandbox_pools import served, spec_with_pools


def test_rows_follow_verls_code_schema() -> None:
    for row in code_synth(50, seed=0, split="train"):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert (row["data_source"], row["ability"], row["reward_model"]["style"]) == (CODE_SYNTH_SOURCE, "code", "rule")
        assert row["prompt"][0]["role"] == "user" and "```python" in row["prompt"][0]["content"]
        tests = json.loads(row["reward_model"]["ground_truth"])
        assert len(cases_from_ground_truth(row["reward_model"]["ground_truth"])) == TESTS
        if "fn_name" in tests:
            assert f"`{tests['fn_name']}(" in row["prompt"][0]["content"]  # the function is asked by its name
        else:
            assert all(isinstance(given, str) for given in tests["inputs"])  # stdin


def test_every_family_is_drawn_and_constants_vary_the_prompts() -> None:
    rows = code_synth(400, seed=0, split="train")
    prompts = {row["prompt"][0]["content"] for row in rows}
    asked = {json.loads(row["reward_model"]["ground_truth"]).get("fn_name") for row in rows}
    assert {"add_2", "add_10", "times_5", "divisible_by_3", "reverse", None} <= asked
    assert len(prompts) > len(FUNCTIONS) + len(PROGRAMS)


def test_generation_is_a_function_of_seed_and_split() -> None:
    assert code_synth(20, seed=0, split="train") == code_synth(20, seed=0, split="train")
    assert code_synth(20, seed=0, split="train") != code_synth(20, seed=0, split="test")
    with pytest.raises(ValueError, match="need n ≥ 0; got n=-1"):
        code_synth(-1, seed=0, split="train")


def test_every_reference_solution_passes_its_tests_in_the_sandbox(tmp_path: Path) -> None:
    rows = code_synth(64, seed=3, split="train")
    samples = [
        RewardInput(r["data_source"], f"```python\n{r['extra_info']['solution']}```", r["reward_model"]["ground_truth"])
        for r in rows
    ]
    with served(spec_with_pools(reward={"executionsPerPod": 2}), tmp_path):
        outputs = make_scorer("code_tests_all_pass", RewardPolicy(timeout_seconds=300)).score(samples)
    failed = [(r["extra_info"]["solution"], o.extra) for r, o in zip(rows, outputs, strict=True) if o.score != 1.0]
    assert not failed, failed[:3]


def test_the_data_command_writes_rows_the_trainer_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "code.parquet"
    assert cli_main(["data", "code-synth", "--output-file", str(out), "--n", "8", "--seed", "1"]) == 0
    assert f"wrote 8 rows (data_source {CODE_SYNTH_SOURCE}, split train, seed 1)" in capsys.readouterr().out
    assert load_rows([str(out)]) == code_synth(8, seed=1, split="train")
