"""``kuberl stats``: token lengths of a dataset, and the length limits they suggest."""

import math
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from kuberl.trainer.data.prompts import check_chat, load_rows_with_origins

PERCENTILES = (50, 90, 95, 99)
LENGTH_MULTIPLE = 64


def percentiles(lengths: list[int]) -> dict[str, int]:
    """Nearest-rank percentiles (the smallest length at or above q% of rows): each is a length some row has."""
    values = np.asarray(lengths)
    summary = {f"p{q}": int(np.percentile(values, q, method="inverted_cdf")) for q in PERCENTILES}
    summary["max"] = int(values.max())
    return summary


def length_stats(paths: list[str], tokenizer: PreTrainedTokenizerBase, prompt_key: str = "prompt") -> dict[str, Any]:
    """Prompt lengths after the chat template (``add_generation_prompt=True``), as the trainer counts them, and,
    when rows carry a reference answer (``extra_info.answer``), answer lengths plus one end-of-sequence token,
    as a response that stops would have."""
    rows, origins = load_rows_with_origins(paths, prompt_key=prompt_key)
    if not rows:
        raise ValueError(f"{paths}: no rows to measure")
    texts = [
        tokenizer.apply_chat_template(
            check_chat(row[prompt_key], where, prompt_key), add_generation_prompt=True, tokenize=False
        )
        for row, where in zip(rows, origins, strict=True)
    ]
    prompt_lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    stats: dict[str, Any] = {"files": list(paths), "rows": len(rows), "prompt_tokens": percentiles(prompt_lengths)}
    answers = [
        str(row["extra_info"]["answer"])
        for row in rows
        if isinstance(row.get("extra_info"), dict) and row["extra_info"].get("answer") is not None
    ]
    if answers:
        answer_lengths = [len(ids) + 1 for ids in tokenizer(answers, add_special_tokens=False)["input_ids"]]
        stats["answer_rows"] = len(answers)
        stats["answer_tokens"] = percentiles(answer_lengths)
    return stats


def round_up(length: int) -> int:
    return max(LENGTH_MULTIPLE, math.ceil(length / LENGTH_MULTIPLE) * LENGTH_MULTIPLE)


def suggest_lengths(stats: dict[str, Any]) -> tuple[int, int | None]:
    """``(maxPromptLength, maxResponseLength)``: the p99 lengths rounded up to a multiple of 64.

    p99 rather than max: the longest 1% of prompts are filtered (``filterOverlongPrompts``) instead of padding every
    batch to the outlier. The response length is ``None`` when the rows carry no reference answers.
    """
    prompt = round_up(stats["prompt_tokens"]["p99"])
    response = round_up(stats["answer_tokens"]["p99"]) if "answer_tokens" in stats else None
    return prompt, response


def format_report(stats: dict[str, Any]) -> str:
    """A table of the percentiles and the suggested ``spec.data`` limits."""
    columns = [f"p{q}" for q in PERCENTILES] + ["max"]
    lines = [
        f"{stats['rows']} rows from {', '.join(stats['files'])}",
        "",
        f"{'tokens':<10}" + "".join(f"{c:>8}" for c in columns),
    ]
    for key, label in (("prompt_tokens", "prompt"), ("answer_tokens", "answer")):
        if key in stats:
            lines.append(f"{label:<10}" + "".join(f"{stats[key][c]:>8}" for c in columns))
    prompt, response = suggest_lengths(stats)
    lines += ["", "suggested (p99 rounded up to a multiple of 64):", f"  data.maxPromptLength: {prompt}"]
    if response is None:
        lines.append("  data.maxResponseLength: no reference answers (extra_info.answer); choose it for the task")
    else:
        lines.append(
            f"  data.maxResponseLength: {response}  (from {stats['answer_rows']} reference answers; "
            "reasoning by the policy may run longer)"
        )
    return "\n".join(lines)
