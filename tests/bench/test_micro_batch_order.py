"""bench/micro_batch_order.py against the committed Qwen2-0.5B rows: the rebuilt steps hold the tokens each run
recorded, and their order is the one docs/performance.md reads the allocator reserve from."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench.micro_batch_order import NotRebuilt, rebuilt_steps

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((RESULTS / name).read_text()))


def test_the_h200_overlapped_rows_last_step_ran_its_smaller_micro_batch_first() -> None:
    steps = rebuilt_steps(_load("grpo_vs_verl_qwen05b_h200_overlap.json"), "kuberl_overlap")
    assert [s.by_first_row for s in steps] == [
        [60184, 27728],
        [60356, 27812],
        [60402, 26950],
        [27720, 60352],
    ]
    assert all(s.largest_first == sorted(s.by_first_row, reverse=True) for s in steps)


def test_the_h100_colocated_row_ran_a_larger_micro_batch_after_a_smaller_one() -> None:
    steps = rebuilt_steps(_load("grpo_vs_verl_qwen05b_h100_kuberl_retries.json"), "kuberl")
    assert steps[0].by_first_row == [38635, 38813, 10464]
    assert steps[2].by_first_row == [38686, 9776, 38890]
    assert [s.largest_first[0] for s in steps] == [38813, 38710, 38890, 38717]


def test_the_h200_colocated_row_ran_largest_first_every_step() -> None:
    steps = rebuilt_steps(_load("grpo_vs_verl_qwen05b_h200.json"), "kuberl")
    assert all(s.by_first_row == s.largest_first and len(s.by_first_row) == 2 for s in steps)


def test_a_row_with_shorter_responses_is_refused() -> None:
    with pytest.raises(NotRebuilt, match=r"steps \[1, 2, 3\] have responses shorter than --max-response 256"):
        rebuilt_steps(_load("grpo_vs_verl_smollm2_h100_fused.json"), "kuberl")


def test_a_rebuilt_step_that_disagrees_with_the_run_is_refused() -> None:
    doc = copy.deepcopy(_load("grpo_vs_verl_qwen05b_h200.json"))
    doc["kuberl"]["steps"][1]["tokens"] += 1
    with pytest.raises(NotRebuilt, match="kuberl step 2: rebuilt 88168 tokens, the run recorded 88169"):
        rebuilt_steps(doc, "kuberl")
