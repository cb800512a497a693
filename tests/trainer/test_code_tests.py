"""The code_tests rewards: programs taken from responses, run against their rows' tests in a real local sandbox
server (as `kuberl run` starts it), scored by pass rate or all-pass, with per-test verdicts as extras."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberl.api.spec import SANDBOXED_REWARDS
from kuberl.trainer.rewards.code_tests import CODE_TESTS_BUILTINS, VERDICTS, CodeTestsScorer, program_of, scored
from kuberl.trainer.rewards.functions import RewardFunctionError, RewardInput, RewardTimeoutError
from kuberl.trainer.rewards.process import make_scorer
from kuberl.trainer.rewards.scoring import RewardPolicy
from tests.trainer.sandbox_pools import served, spec_with_pools

ADD_TESTS = json.dumps({"fn_name": "add", "inputs": [[1, 2], [5, 7], [-3, 3], [0, 0]], "outputs": [3, 12, 0, 0]})
SUM_STDIN_TESTS = json.dumps({"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]})


def block(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\nIt adds."


def test_the_program_is_the_last_closed_python_block() -> None:
    first, second = "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
    assert program_of(block(first) + block(second)) == second
    assert program_of("```py\nprint(1)\n```") == "print(1)\n"
    assert program_of("```Python3\nprint(1)\n```") == "print(1)\n"


def test_a_block_cut_at_the_end_counts_only_without_a_closed_one() -> None:
    done = "def add(a, b):\n    return a + b\n"
    assert program_of("```python\ndef add(a, b):\n    return a +") == "def add(a, b):\n    return a +"
    assert program_of(block(done) + "Usage:\n```python\nprint(add(1,") == done


def test_untagged_empty_and_missing_blocks_are_no_program() -> None:
    assert program_of("```\ndef add(a, b):\n    return a + b\n```") is None
    assert program_of("```python\n\n```") is None
    assert program_of("def add(a, b): return a + b") is None


def test_the_score_is_the_pass_rate_or_all_pass_and_every_verdict_is_an_extra() -> None:
    verdicts = ["passed", "passed", "wrong_answer", "wall_timeout"]
    rate, every = scored(verdicts, all_pass=False), scored(verdicts, all_pass=True)
    assert (rate.score, every.score) == (0.5, 0.0)
    assert rate.extra == every.extra
    assert rate.extra == {
        **{f"test_{v}": 0.0 for v in VERDICTS},
        "test_passed": 0.5,
        "test_wrong_answer": 0.25,
        "test_wall_timeout": 0.25,
        "all_passed": 0.0,
        "code_block": 1.0,
    }
    assert scored(["passed"] * 3, all_pass=True).score == 1.0
    nothing = scored(None, all_pass=False)
    assert nothing.score == 0.0 and nothing.extra["code_block"] == 0.0 and nothing.extra["test_passed"] == 0.0


def test_the_builtins_are_those_admission_asks_a_pool_for() -> None:
    assert set(CODE_TESTS_BUILTINS) == set(SANDBOXED_REWARDS)


@pytest.fixture(scope="module")
def reward_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with served(spec_with_pools(reward={"executionsPerPod": 2}), tmp_path_factory.mktemp("pool")):
        yield


def sample(response: str, tests: str = ADD_TESTS) -> RewardInput:
    return RewardInput("kuberl/code-synth", response, tests, {})


def test_a_batch_runs_in_the_sandbox_and_each_response_gets_its_verdicts(reward_pool: None) -> None:
    batch = [
        sample(block("def add(a, b):\n    return a + b\n")),
        sample(block("def add(a, b):\n    return a + b if a > 0 else -1\n")),  # right on 2 of 4
        sample(block("import time\ndef add(a, b):\n    time.sleep(60)\n")),  # every test would time out: one does
        sample("def add(a, b): return a + b"),  # no block
        sample(block("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\n"), SUM_STDIN_TESTS),
        sample(block("def add(a, b):\n    return a + c\n")),
    ]
    outputs = make_scorer("code_tests", RewardPolicy(timeout_seconds=60)).score(batch)
    assert [o.score for o in outputs] == [1.0, 0.5, 0.0, 0.0, 1.0, 0.0]
    assert outputs[1].extra["test_wrong_answer"] == 0.5
    sleeping = outputs[2].extra
    assert (sleeping["test_wall_timeout"], sleeping["test_skipped"]) == (0.25, 0.75)  # one limit, not one per test
    assert outputs[3].extra["code_block"] == 0.0
    assert outputs[5].extra["test_error"] == 1.0  # NameError
    assert [o.extra["all_passed"] for o in outputs] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_all_pass_scores_only_responses_that_pass_every_test(reward_pool: None) -> None:
    batch = [sample(block("def add(a, b):\n    return a + b\n")), sample(block("def add(a, b):\n    return 3\n"))]
    outputs = make_scorer("code_tests_all_pass", RewardPolicy(timeout_seconds=60)).score(batch)
    assert [o.score for o in outputs] == [1.0, 0.0]
    assert outputs[1].extra["test_passed"] == 0.25  # add(1, 2)


def test_a_row_without_tests_fails_naming_the_sample(reward_pool: None) -> None:
    scorer = CodeTestsScorer("code_tests", RewardPolicy(timeout_seconds=60, on_error="zero", max_error_fraction=1))
    with pytest.raises(RewardFunctionError, match=r"sample 1 \(data_source='kuberl/code-synth'\) has no tests"):
        scorer.score([sample(block("print(1)\n")), sample(block("print(1)\n"), tests="42")])


def test_a_batch_past_the_reward_timeout_fails_with_what_to_change(reward_pool: None, tmp_path: Path) -> None:
    sleepers = [sample(block("import time\ntime.sleep(1.5)\n"), SUM_STDIN_TESTS) for _ in range(4)]
    scorer = CodeTestsScorer("code_tests", RewardPolicy(timeout_seconds=2))
    with pytest.raises(RewardTimeoutError, match=r"within 2 s \(reward.timeoutSeconds\).*reward.sandbox.replicas"):
        scorer.score(sleepers)  # 4 executions of 2 runs × 1.5 s on 2 slots take 6 s


def test_without_an_announced_pool_the_scorer_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERL_SANDBOX_REWARD", raising=False)
    with pytest.raises(LookupError, match=r"reward.sandbox for the reward"):
        make_scorer("code_tests", RewardPolicy(timeout_seconds=60))


CUSTOM = """
from kuberl.sandbox.client import execute_all, job_sandbox
from kuberl.sandbox.protocol import Execution, Run


def compute_score(data_source, solution_str, ground_truth, extra_info):
    sandbox = job_sandbox("reward", request_seconds=60)
    (result,) = execute_all(sandbox, [Execution(solution_str, (Run(stdin="1 2\\n"),))])
    return float(result.runs[0].stdout.strip() == "3")
"""


def test_a_custom_reward_function_reaches_the_announced_pool_from_its_process(
    reward_pool: None, tmp_path: Path
) -> None:
    (tmp_path / "score.py").write_text(CUSTOM)
    scorer = make_scorer(f"{tmp_path}/score.py:compute_score", RewardPolicy(timeout_seconds=120))
    try:
        program = "a, b = map(int, input().split())\nprint(a + b)\n"
        outputs = scorer.score([sample(program), sample("print(4)\n")])
    finally:
        scorer.close()
    assert [o.score for o in outputs] == [1.0, 0.0]
