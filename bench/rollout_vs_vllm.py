"""Benchmark (a): rollout-phase tokens/s of VLLMRollout ÷ standalone ``vllm.LLM.generate``, same prompts, same sampling.

Four measurements of the same workload (``--prompts`` chat prompts × ``--n`` samples × up to ``--max-tokens``):

1. ``standalone``: a plain ``vllm.LLM(model, dtype, gpu_memory_utilization)`` with vLLM's defaults (multiprocess
   engine core, no sleep mode) in a child process, ``llm.generate(TokensPrompt..., SamplingParams(n, temperature,
   top_p, top_k, max_tokens))``: what a user of vLLM alone would run.
2. ``raw_same_engine``: that ``generate`` call on VLLMRollout's own engine (in-process core, sleep mode on).
   ``raw_log_probs_dict`` and ``raw_log_probs_flat``: the same call asking the sampled tokens' log-probs, read from
   vLLM's dict of ``Logprob`` objects per token or from its ``FlatLogprobs`` lists (what VLLMRollout asks);
   ``ratio_flat_vs_dict_log_probs`` is what the flat lists save.
3. ``vllm_rollout``: ``VLLMRollout.generate`` (token ids in, padded tensors out), with and without log-probs.

tokens/s = generated tokens (all samples, eos included) ÷ wall seconds of the call; median of ``--repeats`` calls
after one warm-up. Usage (GPU machine, docs/gpu.md)::

    python bench/rollout_vs_vllm.py --model smollm2 --out bench/results/rollout_vs_vllm.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOPICS = [
    "apples",
    "trains",
    "the moon",
    "prime numbers",
    "a rainy day",
    "chess",
    "bread",
    "rivers",
    "robots",
    "music",
    "volcanoes",
    "bicycles",
    "the ocean",
    "owls",
    "mountains",
    "coffee",
]


def make_prompts(folder: str, count: int) -> list[list[int]]:
    from kuberl.trainer.model.loading import load_tokenizer

    tokenizer = load_tokenizer(folder)
    questions = [
        f"Question {i}: write a short paragraph about {TOPICS[i % len(TOPICS)]} and {i * 7 % 100}."
        for i in range(count)
    ]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in questions
    ]


def timed(fn, repeats: int) -> dict:
    fn()  # warm-up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        runs.append((time.perf_counter() - start, tokens))
    rates = [tokens / seconds for seconds, tokens in runs]
    return {
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_runs": [round(r, 1) for r in rates],
        "tokens_per_call": [t for _, t in runs],
        "seconds_per_call": [round(s, 3) for s, _ in runs],
    }


def standalone(folder: str, prompts: list[list[int]], args: argparse.Namespace, queue) -> None:
    try:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # vLLM's default
        from vllm import LLM, SamplingParams, TokensPrompt

        llm = LLM(
            model=folder,
            dtype="bfloat16",
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            seed=0,
        )
        params = SamplingParams(
            n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens
        )
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]

        def run() -> int:
            outs = llm.generate(requests, params, use_tqdm=False)
            return sum(len(c.token_ids) for o in outs for c in o.outputs)

        queue.put(timed(run, args.repeats))
    except BaseException as exc:
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 or -1: off")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-standalone", action="store_true")
    parser.add_argument("--out", default="bench/results/rollout_vs_vllm.json")
    args = parser.parse_args()

    import torch

    from kuberl.trainer.rollout.vllm import VLLMRollout, model_folder

    folder = model_folder(args.model)
    prompts = make_prompts(folder, args.prompts)
    result: dict = {
        "device": torch.cuda.get_device_name(0),
        "model": args.model,
        "workload": {
            "prompts": args.prompts,
            "n": args.n,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts),
        },
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }

    if not args.skip_standalone:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        start = time.perf_counter()
        child = ctx.Process(target=standalone, args=(folder, prompts, args, queue))
        child.start()
        result["standalone"] = queue.get()
        child.join()
        result["standalone"]["process_wall_s"] = round(time.perf_counter() - start, 1)
        print("standalone:", json.dumps(result["standalone"]), flush=True)

    from vllm import SamplingParams, TokensPrompt

    start = time.perf_counter()
    rollout = VLLMRollout(
        folder,
        pad_id=0,
        eos_ids=[],
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        calculate_log_probs=False,
    )
    result["vllm_rollout_engine_start_s"] = round(time.perf_counter() - start, 1)
    from kuberl.trainer.model.loading import load_tokenizer

    tokenizer = load_tokenizer(folder)
    rollout.pad_id = tokenizer.pad_token_id
    rollout.eos_ids = [tokenizer.eos_token_id]
    params = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens
    )
    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def raw() -> int:
        outs = rollout.llm.generate(requests, params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def wrapped() -> int:
        batch = rollout.generate(
            prompts,
            args.n,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k if args.top_k > 0 else -1,
            max_new_tokens=args.max_tokens,
        )
        return int(batch.response_mask.sum())

    def raw_log_probs(flat: bool) -> Callable[[], int]:
        """vLLM's own call asking the sampled tokens' log-probs, read as the trainer reads them: from a dict of
        ``Logprob`` objects per token (vLLM's default) or from ``FlatLogprobs``' lists (what VLLMRollout asks)."""
        asked = params.clone()
        asked.logprobs, asked.flat_logprobs, asked.detokenize = 0, flat, False

        def run() -> int:
            outs = rollout.llm.generate(requests, asked, use_tqdm=False)
            completions = [c for o in outs for c in o.outputs]
            if flat:
                return sum(len(c.logprobs.logprobs) for c in completions)
            return sum(len([c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)]) for c in completions)

        return run

    result["raw_same_engine"] = timed(raw, args.repeats)
    print("raw_same_engine:", json.dumps(result["raw_same_engine"]), flush=True)
    for way in ("dict", "flat"):
        result[f"raw_log_probs_{way}"] = timed(raw_log_probs(way == "flat"), args.repeats)
        print(f"raw_log_probs_{way}:", json.dumps(result[f"raw_log_probs_{way}"]), flush=True)
    result["ratio_flat_vs_dict_log_probs"] = round(
        result["raw_log_probs_flat"]["tokens_per_s"] / result["raw_log_probs_dict"]["tokens_per_s"], 3
    )
    result["vllm_rollout"] = timed(wrapped, args.repeats)
    print("vllm_rollout:", json.dumps(result["vllm_rollout"]), flush=True)
    rollout.calculate_log_probs = True
    result["vllm_rollout_with_logprobs"] = timed(wrapped, args.repeats)
    print("vllm_rollout_with_logprobs:", json.dumps(result["vllm_rollout_with_logprobs"]), flush=True)

    ours = result["vllm_rollout"]["tokens_per_s"]
    result["ratio_vs_raw_same_engine"] = round(ours / result["raw_same_engine"]["tokens_per_s"], 3)
    if "tokens_per_s" in result.get("standalone", {}):
        result["ratio_vs_standalone"] = round(ours / result["standalone"]["tokens_per_s"], 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'what':<28}{'tokens/s':>12}")
    for key in (
        "standalone",
        "raw_same_engine",
        "raw_log_probs_dict",
        "raw_log_probs_flat",
        "vllm_rollout",
        "vllm_rollout_with_logprobs",
    ):
        if "tokens_per_s" in result.get(key, {}):
            print(f"{key:<28}{result[key]['tokens_per_s']:>12.0f}")
    print(
        "ratio vs standalone:",
        result.get("ratio_vs_standalone"),
        " vs raw same engine:",
        result["ratio_vs_raw_same_engine"],
        " log-probs flat vs dict:",
        result["ratio_flat_vs_dict_log_probs"],
    )
    rollout.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
