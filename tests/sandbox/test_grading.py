"""Pass or fail per test, decided outside the sandbox from verl-style ground truth."""

from __future__ import annotations

import json

import pytest

from kuberl.sandbox.grading import Case, cases_from_ground_truth, passed, stdout_matches, values_match
from kuberl.sandbox.protocol import Call, Outcome, Run, RunResult


def test_stdin_tests_feed_each_input_and_keep_the_expected_output_outside() -> None:
    tests = cases_from_ground_truth(json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}))
    assert [t.run for t in tests] == [Run(stdin="1 2\n"), Run(stdin="3 4\n")]
    assert [t.expected for t in tests] == ["3\n", "7\n"]


def test_call_tests_name_the_function_and_its_arguments() -> None:
    tests = cases_from_ground_truth(json.dumps({"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}))
    assert tests[1] == Case(Run(call=Call("add", [3, 4])), 7)


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ("not json", "not JSON"),
        ('{"inputs": [1]}', 'must be {"inputs"'),
        ('{"inputs": [1, 2], "outputs": [1]}', "2 inputs and 1 outputs"),
        ('{"inputs": [], "outputs": []}', "at least one"),
    ],
)
def test_malformed_ground_truth_is_refused_with_what_is_wrong(ground_truth: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cases_from_ground_truth(ground_truth)


def test_output_ignores_trailing_whitespace_and_compares_numbers_within_tolerance() -> None:
    assert stdout_matches("1 2\n3\n", "1 2   \n3\n\n\n")
    assert stdout_matches("0.3333333", "0.33333334")
    assert not stdout_matches("1 2\n3\n", "1 2\n4\n")
    assert not stdout_matches("1\n2\n", "1\n")


def test_return_values_compare_as_json_with_float_tolerance_and_bools_apart() -> None:
    assert values_match([1, [2.0, 3]], [1, [2.0000000001, 3]])
    assert values_match({"a": 1}, {"a": 1.0})
    assert not values_match(True, 1)
    assert not values_match([1, 2], [1, 2, 3])


def test_only_an_ok_run_can_pass() -> None:
    test = Case(Run(stdin=""), "42\n")
    assert passed(test, RunResult(Outcome.OK, exit_code=0, stdout="42\n"))
    assert not passed(test, RunResult(Outcome.WALL_TIMEOUT, stdout="42\n"))
    assert not passed(test, RunResult(Outcome.ERROR, exit_code=1, stdout="42\n"))
    call = Case(Run(call=Call("f", [])), 42)
    assert passed(call, RunResult(Outcome.OK, exit_code=0, returned="42"))
    assert not passed(call, RunResult(Outcome.OK, exit_code=0, returned=None))
