"""The micro-batches of every step of a GRPO benchmark side, rebuilt on a CPU, in the order the trainer ran them
before it ran the largest first (by first row) and in the order it runs them now.

The benchmarks' data, prompt loader and token-budget packing are deterministic, so the micro-batches of a side whose
responses all ran to ``--max-response`` tokens (every step's ``response_length_mean`` equal to it) follow from the
result file alone. The rebuilt steps must hold the tokens the run recorded, or the script refuses. This is how
docs/performance.md traced the allocator reserve of the Qwen2-0.5B rows to the order of their micro-batches::

    python bench/micro_batch_order.py bench/results/grpo_vs_verl_qwen05b_h200_overlap.json kuberl_overlap
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grpo_bench import write_data
from kuberl.trainer.data.prompts import PromptDataset, PromptLoader, load_rows
from kuberl.trainer.model.loading import load_tokenizer
from kuberl.trainer.model.microbatch import Rows, micro_batches, split_by_tokens
from kuberl.trainer.rollout.vllm import model_folder

TOKENIZER = "smollm2"
"""Every benchmark model's tokenizer: SmolLM2's own, and the one bench/shapes.py gives the random-weight shapes."""


class NotRebuilt(ValueError):
    """The result does not determine its micro-batches."""


@dataclass(frozen=True)
class StepBatches:
    step: int
    tokens: int
    by_first_row: list[int]
    """Tokens of each micro-batch in the order of their first row: how the trainer ran them before largest first."""
    largest_first: list[int]
    """The same micro-batches in the order the trainer runs them now."""


def rows_of(prompt_lens: list[int], response_len: int) -> Rows:
    """Rows with these real lengths (what packing reads of them)."""
    width = max(prompt_lens)
    prompt_mask = torch.tensor([[0] * (width - n) + [1] * n for n in prompt_lens])
    response_mask = torch.ones(len(prompt_lens), response_len, dtype=torch.long)
    return {"prompt_mask": prompt_mask, "responses": response_mask, "response_mask": response_mask}


def rebuilt_steps(doc: dict[str, Any], side: str) -> list[StepBatches]:
    """Each recorded step of ``doc[side]`` with its micro-batches' tokens; :class:`NotRebuilt` when the result does
    not determine them."""
    settings, result = doc["settings"], doc[side]
    max_response, group = settings["max_response"], settings["group"]
    short = [s["step"] for s in result["steps"] if s["response_length_mean"] != max_response]
    if short:
        raise NotRebuilt(
            f"{side}: steps {short} have responses shorter than --max-response {max_response}; their lengths are not "
            "in the result, so their micro-batches cannot be rebuilt"
        )
    budget = (result.get("plan") or {}).get("token_budget")
    budget = budget or result["spec"]["batch"].get("dynamicBatchSize", {}).get("maxTokenLenPerGPU")
    if not budget:
        raise NotRebuilt(f"{side}: no token budget in the result (fixed-size micro-batches keep their rows' order)")
    folder = model_folder(TOKENIZER)
    with tempfile.TemporaryDirectory() as work:
        data = write_data(
            folder, Path(work) / "train.parquet", settings["data"]["rows"], settings["max_prompt"], settings["seed"]
        )
        rows = load_rows([data["file"]])
    dataset = PromptDataset(
        rows, load_tokenizer(folder), max_prompt_length=settings["max_prompt"], filter_overlong=False
    )
    loader = PromptLoader(dataset, settings["prompts"], seed=result["spec"]["data"]["seed"])
    steps = []
    for recorded in result["steps"]:
        prompt_lens = [len(prompt.input_ids) for prompt in loader.next_batch() for _ in range(group)]
        tokens = [n + max_response for n in prompt_lens]
        if sum(tokens) != recorded["tokens"]:
            raise NotRebuilt(
                f"{side} step {recorded['step']}: rebuilt {sum(tokens)} tokens, the run recorded {recorded['tokens']}"
            )
        first_row = split_by_tokens(prompt_lens, [max_response] * len(tokens), budget)
        now = micro_batches(rows_of(prompt_lens, max_response), micro_batch_size=None, max_tokens=budget)
        steps.append(StepBatches(recorded["step"], sum(tokens), bin_tokens(first_row, tokens), bin_tokens(now, tokens)))
    return steps


def bin_tokens(bins: list[list[int]], tokens: list[int]) -> list[int]:
    return [sum(tokens[i] for i in members) for members in bins]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="a bench/results/grpo_vs_*.json file")
    parser.add_argument("side", help="its kuberl side, e.g. kuberl or kuberl_overlap")
    args = parser.parse_args()
    doc = json.loads(Path(args.result).read_text())
    if args.side not in doc:
        parser.error(
            f"{args.result} has no side {args.side!r}; its sides: {', '.join(k for k in doc if 'kuberl' in k)}"
        )
    try:
        steps = rebuilt_steps(doc, args.side)
    except NotRebuilt as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    memory = {s["step"]: s.get("trainer_gib") or {} for s in doc[args.side]["steps"]}
    for step in steps:
        line = f"step {step.step}: {step.tokens} tokens; by first row {step.by_first_row}, largest first "
        gib = memory[step.step]
        if gib.get("allocated") is not None:
            line += f"{step.largest_first}; peaks so far: allocated {gib['allocated']:.2f}, reserved {gib['reserved']:.2f} GiB"
        else:
            line += str(step.largest_first)
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
