"""GSM8K reward for the GPU GRPO runs: verl's *flexible* rule (the last number in the response is the answer).

Why not the builtin strict rule: measured on CPU (HF generate, temperature 1, 32 problems × 8 samples of
``kuberl data gsm8k-synth --max-operand 10 --steps 1 1``), SmolLM2-135M-Instruct never ends with a correct
``#### <n>`` (strict mean 0.000, so every GRPO group has zero advantage), while its last number is right 6.6% of the
time, with reward variance inside 47% of the groups. ``strict`` and ``formatted`` are logged beside the score
(``reward_extra/strict/mean``, ``reward_extra/formatted/mean``) to show whether the format is learnt as well.

Use: ``reward.function: tests/gpu/gsm8k_flexible_reward.py:compute_score``.
"""

from __future__ import annotations

import re
from typing import Any

from kuberl.trainer.rewards.functions import GSM8K_ANSWER, GSM8K_TAIL_CHARS, gsm8k

NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def last_number(text: str) -> str | None:
    found = NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, float]:
    tail = solution_str[-GSM8K_TAIL_CHARS:]
    return {
        "score": float(last_number(tail) == str(ground_truth)),
        "strict": gsm8k(data_source, solution_str, ground_truth, extra_info),
        "formatted": float(bool(GSM8K_ANSWER.findall(tail))),
    }
