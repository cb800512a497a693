"""Generated tasks in verl's row schema, for runs and tests that must not download a dataset."""

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Liam")
THEN = ("Then", "Later", "After that", "Next")
ITEMS = ("apples", "marbles", "stickers", "books", "cookies", "pencils", "coins", "cards", "shells", "stamps")
GSM8K_SYNTH_SOURCE = "kuberl/gsm8k-synth"
"""The data_source of generated GSM8K-like rows: scored by the gsm8k rule, reported apart from real GSM8K."""
MAX_OPERAND = 50
STEPS = (1, 3)
"""gsm8k_synth's default problem shape: starting amounts and addends up to 50, one to three arithmetic steps."""


def write_rows(rows: list[dict[str, Any]], path: str) -> Path:
    """``.parquet`` (what verl reads) or ``.jsonl``, chosen by the suffix."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), out)
    elif out.suffix == ".jsonl":
        out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        raise ValueError(f"{path}: write .parquet or .jsonl, not {out.suffix!r}")
    return out


def word_problem(rng: random.Random, max_operand: int, num_steps: int) -> tuple[str, str, int]:
    """A question, a GSM8K-style worked answer (``<<a+b=c>>`` annotations, ``#### n``) and the result."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(1, max_operand)
    question = [f"{name} has {value} {item}."]
    answer = []
    for _ in range(num_steps):
        divisors = [k for k in range(2, 10) if value % k == 0]
        operation = rng.choice(
            ["add"] + ["multiply"] * (value <= max_operand) + ["subtract"] * (value > 1) + ["divide"] * bool(divisors)
        )
        then = rng.choice(THEN)
        if operation == "add":
            b = rng.randint(1, max_operand)
            question.append(f"{then} {name} buys {b} more {item}.")
            answer.append(f"After buying {b} more, {name} has {value}+{b} = <<{value}+{b}={value + b}>>{value + b}.")
            value += b
        elif operation == "subtract":
            b = rng.randint(1, value - 1)
            question.append(f"{then} {name} gives {b} {item} to a friend.")
            answer.append(f"After giving {b} away, {name} has {value}-{b} = <<{value}-{b}={value - b}>>{value - b}.")
            value -= b
        elif operation == "divide":
            k = rng.choice(divisors)
            question.append(f"{then} {name} shares the {item} equally among {k} bags and keeps one bag.")
            answer.append(f"One bag holds {value}/{k} = <<{value}/{k}={value // k}>>{value // k}.")
            value //= k
        else:  # multiply
            k = rng.randint(2, 4)
            question.append(f"{then} {name} ends up with {k} times as many {item} as before.")
            answer.append(f"{k} times as many is {value}*{k} = <<{value}*{k}={value * k}>>{value * k}.")
            value *= k
    question.append(f"How many {item} does {name} have now?")
    answer.append(f"#### {value}")
    return " ".join(question), "\n".join(answer), value


def gsm8k_synth(
    n: int, *, seed: int, split: str, max_operand: int = MAX_OPERAND, steps: tuple[int, int] = STEPS
) -> list[dict[str, Any]]:
    """``n`` GSM8K-like word problems of ``steps`` (inclusive range) arithmetic steps each.

    Rows look like verl's GSM8K preprocessing output (the question followed by verl's instruction, the bare number
    as ground truth) but are labelled ``data_source`` ``kuberl/gsm8k-synth``, so validation metrics
    (``val-core/kuberl/gsm8k-synth/...``) never pass for real GSM8K; the builtin reward scores them with the
    ``gsm8k`` rule. The split name is part of the seed, so train and test draws differ.
    """
    if n < 0 or max_operand < 2 or not 1 <= steps[0] <= steps[1]:
        raise ValueError(
            f"need n ≥ 0, max_operand ≥ 2 and 1 ≤ steps[0] ≤ steps[1]; got n={n}, "
            f"max_operand={max_operand}, steps={steps}"
        )
    rng = random.Random(f"gsm8k_synth:{seed}:{split}")
    rows = []
    for index in range(n):
        question, answer, value = word_problem(rng, max_operand, rng.randint(*steps))
        rows.append(
            {
                "data_source": GSM8K_SYNTH_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(value)},
                "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
            }
        )
    return rows


def digit_copy(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` prompts "Answer with the digit d." whose reward (``prefix_match``) is 1 when the response starts with d.

    Why this task: a randomly initialised tiny model over the ~100-token character vocabulary answers with the
    right digit first with probability about 1/100, so the mean reward starts near 0.01. Any digit is right one
    time in ten, so the first thing the policy learns, answering with a digit, lifts the mean about ten-fold; the
    right digit sits at a fixed distance from the end of the templated prompt, so copying it is learnable next.
    Measured on CPU (tiny llama, 16 prompts × 8 samples, on-policy group-normalised policy gradient, lr 5e-3 to
    1e-2): the mean rose from ~0.01 to ~0.1 within 25–55 steps; copying had not emerged after 135 steps.
    """
    rng = random.Random(f"digit_copy:{seed}:{split}")
    rows = []
    for index in range(n):
        digit = str(rng.randrange(10))
        rows.append(
            {
                "data_source": "kuberl/digits",
                "prompt": [{"role": "user", "content": f"Answer with the digit {digit}."}],
                "ability": "copy",
                "reward_model": {"style": "rule", "ground_truth": digit},
                "extra_info": {"split": split, "index": index, "answer": digit},
            }
        )
    return rows


CALCULATOR_CALL = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{}"}}}}</tool_call>'
"""The call the ``chat`` layout shows: the hermes syntax of tool-calling chat templates (``agent.callFormat: hermes``)."""
SHORT_CALCULATOR_CALL = '{{"arguments":{{"expression":"{}"}},"name":"calculator"}}'
"""The call the ``short`` layout asks for: bare JSON (``agent.callFormat: json``), 57 characters, the expression
first, so it starts 28 characters into the call."""
ARITHMETIC_LAYOUTS = ("chat", "short")


def arithmetic(n: int, *, seed: int, split: str, layout: str = "chat") -> list[dict[str, Any]]:
    """``n`` products of a 3-digit and a 2-digit number, scored by ``final_answer`` on the policy's last turn
    (``rollout.agent`` with the calculator tool); ``extra_info["call"]`` is the call that solves the row.

    ``chat``: the question in words with the hermes call spelled out, for chat models.
    ``short``: the prompt is the bare expression (``275*31``), the products have 5 digits and the call is
    :data:`SHORT_CALCULATOR_CALL`, so the expression and the tool's answer sit at fixed, short distances from where
    the policy copies them: the variant a tiny CPU model learns (tests/trainer/test_agent_learning_cpu.py).

    Why this task: small models rarely multiply such numbers right on their own, and the call is known, so a
    policy that learns to call the tool and then repeat its answer gets the reward (docs/agentic.md).
    """
    if layout not in ARITHMETIC_LAYOUTS:
        raise ValueError(f"layout {layout!r}: use one of {ARITHMETIC_LAYOUTS}")
    rng = random.Random(f"arithmetic:{seed}:{split}" + ("" if layout == "chat" else f":{layout}"))
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        expression = f"{a}*{b}"
        if layout == "chat":
            call = CALCULATOR_CALL.format(expression)
            content = f"What is {a} times {b}? Call the calculator with {call} and then answer with the number only."
        elif a * b < 10_000:
            continue
        else:
            call, content = SHORT_CALCULATOR_CALL.format(expression), expression
        rows.append(
            {
                "data_source": "kuberl/arithmetic",
                "prompt": [{"role": "user", "content": content}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(a * b)},
                "extra_info": {"split": split, "index": len(rows), "expression": expression, "call": call},
            }
        )
    return rows


def main_gsm8k_synth(
    out: str, n: int, seed: int, split: str, *, max_operand: int = MAX_OPERAND, steps: tuple[int, int] = STEPS
) -> None:
    """``kuberl data gsm8k-synth``: write ``n`` generated GSM8K problems to ``out`` (.parquet or .jsonl)."""
    path = write_rows(gsm8k_synth(n, seed=seed, split=split, max_operand=max_operand, steps=steps), out)
    print(
        f"wrote {n} rows (data_source {GSM8K_SYNTH_SOURCE}, split {split}, seed {seed}, max_operand {max_operand}, "
        f"steps {steps[0]}..{steps[1]}) to {path}"
    )


def main_arithmetic(out: str, n: int, seed: int, split: str, layout: str = "chat") -> None:
    """``kuberl data arithmetic``: write ``n`` calculator-tool problems to ``out`` (.parquet or .jsonl)."""
    path = write_rows(arithmetic(n, seed=seed, split=split, layout=layout), out)
    print(f"wrote {n} rows (data_source kuberl/arithmetic, layout {layout}, split {split}, seed {seed}) to {path}")


def main_digit_copy(out: str, n: int, seed: int, split: str) -> None:
    """``kuberl data digits``: write ``n`` digit-copy prompts for tiny models to ``out`` (.parquet or .jsonl)."""
    path = write_rows(digit_copy(n, seed=seed, split=split), out)
    print(f"wrote {n} rows (data_source kuberl/digits, split {split}, seed {seed}) to {path}")
