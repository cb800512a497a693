"""``kuberl data code-synth``: small programming tasks with tests, in verl's code-dataset schema, generated here.

Each row asks for a function (or, for a share of rows, a program reading stdin) and carries its tests as
``reward_model.ground_truth``: ``{"fn_name": ..., "inputs": [[args]...], "outputs": [...]}`` or
``{"inputs": ["stdin"...], "outputs": ["stdout"...]}`` (JSON), as verl's PRIME and TACO code rows do, scored by the
``code_tests`` rewards in the job's sandbox (docs/rewards.md). ``extra_info`` holds a reference solution that passes
every test (tests/trainer/test_code_synth.py runs each in the sandbox).

The tasks are one-liners in a handful of families (arithmetic, comparisons, strings, lists), some with a constant
drawn per row so that prompts differ: a 135M chat model (SmolLM2-135M-Instruct) solves about a quarter of them as
asked at the start, most failures being a function named otherwise than asked or a broken second block, which a few
GRPO steps correct (examples/code-sandbox-cpu.yaml).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kuberl.trainer.data.tasks import write_rows

CODE_SYNTH_SOURCE = "kuberl/code-synth"
TESTS = 4
"""Tests per row."""
FUNCTION_PROMPT = "Write a Python function `{signature}` that {what}. Answer with the function in a ```python block."
PROGRAM_PROMPT = "Write a Python program that {what}. Answer with the program in a ```python block."
STDIN_SHARE = 0.25
"""The share of rows asking for a program that reads stdin rather than a function."""

Inputs = Callable[[random.Random], list[Any]]


@dataclass(frozen=True)
class FunctionTask:
    """``name(params)`` that ``what`` (may hold ``{k}``, a constant drawn per row from ``constants``)."""

    name: str
    params: str
    what: str
    solution: str  # the body's expression over the parameters (and {k})
    inputs: Inputs  # one call's arguments
    constants: tuple[int, ...] = ()


@dataclass(frozen=True)
class ProgramTask:
    """A program that ``what``: reads ``stdin`` lines, prints the answer."""

    what: str
    solution: str  # the whole program
    stdin: Callable[[random.Random], str]


def numbers(count: int, low: int = -20, high: int = 20) -> Inputs:
    return lambda rng: [rng.randint(low, high) for _ in range(count)]


def word(rng: random.Random) -> list[Any]:
    return ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6)))]


def number_list(rng: random.Random) -> list[Any]:
    return [[rng.randint(-9, 9) for _ in range(rng.randint(1, 5))]]


FUNCTIONS = (
    FunctionTask("add", "a, b", "returns the sum of a and b", "a + b", numbers(2)),
    FunctionTask("subtract", "a, b", "returns a minus b", "a - b", numbers(2)),
    FunctionTask("multiply", "a, b", "returns the product of a and b", "a * b", numbers(2)),
    FunctionTask("square", "x", "returns x squared", "x * x", numbers(1)),
    FunctionTask("add_{k}", "x", "returns x plus {k}", "x + {k}", numbers(1), (2, 3, 5, 7, 10)),
    FunctionTask("times_{k}", "x", "returns x multiplied by {k}", "x * {k}", numbers(1), (2, 3, 4, 5)),
    FunctionTask("is_even", "n", "returns True if n is even and False otherwise", "n % 2 == 0", numbers(1)),
    FunctionTask(
        "divisible_by_{k}", "n", "returns True if n is divisible by {k}", "n % {k} == 0", numbers(1, 0, 50), (3, 4, 5)
    ),
    FunctionTask("maximum", "a, b", "returns the larger of a and b", "max(a, b)", numbers(2)),
    FunctionTask("minimum", "a, b", "returns the smaller of a and b", "min(a, b)", numbers(2)),
    FunctionTask("absolute", "x", "returns the absolute value of x", "abs(x)", numbers(1)),
    FunctionTask("reverse", "s", "returns the string s reversed", "s[::-1]", word),
    FunctionTask("to_upper", "s", "returns the string s in upper case", "s.upper()", word),
    FunctionTask("list_sum", "xs", "returns the sum of the numbers in the list xs", "sum(xs)", number_list),
    FunctionTask("list_max", "xs", "returns the largest number in the list xs", "max(xs)", number_list),
    FunctionTask("first", "xs", "returns the first element of the list xs", "xs[0]", number_list),
    FunctionTask("last", "xs", "returns the last element of the list xs", "xs[-1]", number_list),
)
PROGRAMS = (
    ProgramTask(
        "reads two integers from one line of standard input and prints their sum",
        "a, b = map(int, input().split())\nprint(a + b)\n",
        lambda rng: f"{rng.randint(-50, 50)} {rng.randint(-50, 50)}\n",
    ),
    ProgramTask(
        "reads one integer from standard input and prints its square",
        "n = int(input())\nprint(n * n)\n",
        lambda rng: f"{rng.randint(-30, 30)}\n",
    ),
    ProgramTask(
        "reads a line of text from standard input and prints it reversed",
        "print(input()[::-1])\n",
        lambda rng: word(rng)[0] + "\n",
    ),
)


def function_row(task: FunctionTask, rng: random.Random) -> tuple[str, dict[str, Any], str]:
    """The prompt, the tests and the reference solution of one function task."""
    k = rng.choice(task.constants) if task.constants else 0
    name, what, body = (text.format(k=k) for text in (task.name, task.what, task.solution))
    solution = f"def {name}({task.params}):\n    return {body}\n"
    namespace: dict[str, Any] = {}
    exec(solution, namespace)  # the reference, ours: it computes the expected outputs
    calls = [task.inputs(rng) for _ in range(TESTS)]
    tests = {"fn_name": name, "inputs": calls, "outputs": [namespace[name](*args) for args in calls]}
    return FUNCTION_PROMPT.format(signature=f"{name}({task.params})", what=what), tests, solution


def program_row(task: ProgramTask, rng: random.Random) -> tuple[str, dict[str, Any], str]:
    """The prompt, the tests and the reference solution of one stdin task."""
    stdins = [task.stdin(rng) for _ in range(TESTS)]
    tests = {"inputs": stdins, "outputs": [printed(task.solution, given) for given in stdins]}
    return PROGRAM_PROMPT.format(what=task.what), tests, task.solution


def printed(program: str, stdin: str) -> str:
    """What ``program`` (the reference, ours) prints when ``stdin`` is its standard input."""
    out, given = io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out):
            exec(program, {})
    finally:
        sys.stdin = given
    return out.getvalue()


def code_synth(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` programming tasks with their tests; the split name is part of the seed, so train and test differ."""
    if n < 0:
        raise ValueError(f"need n ≥ 0; got n={n}")
    rng = random.Random(f"code_synth:{seed}:{split}")
    rows = []
    for index in range(n):
        if rng.random() < STDIN_SHARE:
            program = rng.choice(PROGRAMS)
            prompt, tests, solution = program_row(program, rng)
        else:
            prompt, tests, solution = function_row(rng.choice(FUNCTIONS), rng)
        rows.append(
            {
                "data_source": CODE_SYNTH_SOURCE,
                "prompt": [{"role": "user", "content": prompt}],
                "ability": "code",
                "reward_model": {"style": "rule", "ground_truth": json.dumps(tests)},
                "extra_info": {"split": split, "index": index, "solution": solution},
            }
        )
    return rows


def main_code_synth(out: str, n: int, seed: int, split: str) -> None:
    """``kuberl data code-synth``: write ``n`` programming tasks with tests to ``out`` (.parquet or .jsonl)."""
    path = write_rows(code_synth(n, seed=seed, split=split), out)
    print(f"wrote {n} rows (data_source {CODE_SYNTH_SOURCE}, split {split}, seed {seed}) to {path}")
