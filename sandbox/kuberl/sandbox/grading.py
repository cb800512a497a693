"""Whether runs passed their tests, decided outside the sandbox: the expected outputs never enter it.

Tests come in the schema of verl's code datasets (PRIME, TACO/APPS; `reward_model.ground_truth` as JSON):
`{"inputs": [...], "outputs": [...]}` feeds each input on stdin and compares stdout, and with `"fn_name"` each
input is the list of arguments of a call whose return value is compared.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from kuberl.sandbox.protocol import Call, Outcome, Run, RunResult

FLOAT_TOLERANCE = 1e-6  # relative (and absolute) tolerance for floats in return values and stdout tokens


@dataclass(frozen=True)
class Case:
    run: Run
    expected: Any  # the expected stdout (a string), or with run.call the expected return value (a JSON value)


def cases_from_ground_truth(ground_truth: str) -> list[Case]:
    """The tests of one row; ValueError naming what is wrong with a malformed ground truth."""
    try:
        spec = json.loads(ground_truth)
    except json.JSONDecodeError as exc:
        raise ValueError(f"ground truth is not JSON: {exc}") from None
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("inputs"), list)
        or not isinstance(spec.get("outputs"), list)
    ):
        raise ValueError('ground truth must be {"inputs": [...], "outputs": [...]} (optionally with "fn_name")')
    inputs, outputs = spec["inputs"], spec["outputs"]
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(
            f"ground truth has {len(inputs)} inputs and {len(outputs)} outputs; needs as many, at least one"
        )
    function = spec.get("fn_name")
    if function:
        return [
            Case(Run(call=Call(str(function), args if isinstance(args, list) else [args])), expected)
            for args, expected in zip(inputs, outputs, strict=True)
        ]
    return [Case(Run(stdin=str(given)), str(expected)) for given, expected in zip(inputs, outputs, strict=True)]


def passed(case: Case, result: RunResult) -> bool:
    if result.outcome is not Outcome.OK:
        return False
    if case.run.call is None:
        return stdout_matches(str(case.expected), result.stdout)
    if result.returned is None:
        return False
    try:
        returned = json.loads(result.returned)
    except json.JSONDecodeError:
        return False
    return values_match(case.expected, returned)


def stdout_matches(expected: str, actual: str) -> bool:
    """Equal line by line, ignoring trailing whitespace and blank lines at the end; numbers within tolerance."""
    want, got = _lines(expected), _lines(actual)
    return len(want) == len(got) and all(_line_matches(w, g) for w, g in zip(want, got, strict=True))


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _line_matches(want: str, got: str) -> bool:
    if want == got:
        return True
    want_tokens, got_tokens = want.split(), got.split()
    return len(want_tokens) == len(got_tokens) and all(
        w == g or _close(w, g) for w, g in zip(want_tokens, got_tokens, strict=True)
    )


def _close(want: str, got: str) -> bool:
    try:
        return math.isclose(float(want), float(got), rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)
    except ValueError:
        return False


def values_match(expected: Any, returned: Any) -> bool:
    """JSON values equal, lists and tuples alike, floats within tolerance; bools are not numbers."""
    if isinstance(expected, bool) or isinstance(returned, bool):
        return expected is returned
    if isinstance(expected, (int, float)) and isinstance(returned, (int, float)):
        return math.isclose(expected, returned, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)
    if isinstance(expected, list) and isinstance(returned, list):
        return len(expected) == len(returned) and all(
            values_match(e, r) for e, r in zip(expected, returned, strict=True)
        )
    if isinstance(expected, dict) and isinstance(returned, dict):
        return expected.keys() == returned.keys() and all(values_match(expected[k], returned[k]) for k in expected)
    return bool(expected == returned)
