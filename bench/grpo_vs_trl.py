"""Benchmark (b): end-to-end GRPO tokens/s of ``kuberl run`` ÷ TRL's ``GRPOTrainer``, same model, batch, lengths, group.

The job, the data, the kuberl side and the summary are ``bench/grpo_bench.py``'s (its docstring says what is shared
and how tokens/s are counted). Each side runs in a fresh subprocess, one after the other, while NVML samples the card:

- kuberl: an RLJob written from the settings, ``python -m kuberl.cli run SPEC``; ``rollout.engine vllm`` colocated on
  a GPU (``hf`` on CPU); the micro-batch token budget from ``--max-tokens`` (default ``auto``: left out of the RLJob,
  the trainer takes the largest its memory plan fits on the card). With ``--overlap on`` or ``both`` also the
  one-step-off-policy row (side ``kuberl_overlap``): ``rollout.placement separate`` (on one GPU the engine shares the
  card in its own process, weights by CUDA IPC) with ``rollout.overlap oneStepOffPolicy`` and the rollout correction;
  with ``--overlap async`` that row and the asynchronous ones (``kuberl_async_k1``, ``kuberl_async_k2``:
  ``rollout.overlap async`` at ``maxStaleness`` 1 and 2, and ``kuberl_async_k2_partial`` at 2 with
  ``partialRollouts``, docs/async.md), each printed against the one-step-off row
  (``ratio_kuberl_async_k2_vs_overlap``, issue 36's goal 1.3 on one card); ``--overlap all`` runs every row.
- TRL: ``GRPOTrainer`` with ``per_device_train_batch_size`` = micro-batch, ``gradient_accumulation_steps`` =
  prompts × group ÷ micro-batch, ``num_generations`` = group, ``beta`` 0, bf16 autocast over fp32 weights on a GPU;
  generation ``--trl-generation vllm`` (``use_vllm``, ``vllm_mode="colocate"``, the same memory share; TRL's
  defaults otherwise, e.g. importance-sampling correction on) or ``hf`` (transformers ``generate``). TRL has no token
  budget: ``--trl-micro-batches 32 64 128 256`` runs it once per micro-batch (each in its own process), records a
  micro-batch that runs out of memory as such, and takes the ratio against the fastest (side ``trl``; every run under
  ``trl_sweep``). Per step: a callback times ``on_step_begin`` → ``on_step_end`` and takes the growth of
  ``state.num_input_tokens_seen``.

A side that fails or outlives ``--timeout`` is recorded with the tail of its stderr; the JSON is written anyway and
the exit code is 1. Usage (GPU machine, docs/gpu.md; TRL and the wheels it needs there from ``.device/x-trl``)::

    python bench/grpo_vs_trl.py --model smollm2 --steps 4 --overlap both --trl-micro-batches 32 64 128 256 \\
        --out bench/results/grpo_vs_trl.json
    python bench/grpo_vs_trl.py --model shape:llama-1.1b --work-dir /tmp/bench-1b ...   # the 1.14B random llama
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grpo_bench import (
    KUBERL_SIDES,
    OFFLINE_ENV,
    OVERLAP_ROWS,
    Earlier,
    add_job_arguments,
    check_steps,
    end_if_stopped,
    gpu_name,
    job_settings,
    measured,
    merge_sides,
    model_folder_of,
    print_ratios,
    print_side,
    read_earlier,
    result_header,
    run_kuberl,
    run_side,
    stop_on_sigterm,
    write_data,
    write_result,
)

BENCHMARK = "end-to-end GRPO tokens/s, kuberl run ÷ TRL GRPOTrainer"
PACKAGES = ("torch", "transformers", "vllm", "ray", "trl", "accelerate", "datasets", "kuberl")
VLLM_DEFAULT_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}  # vLLM's external_launcher requires the last one
OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError")


# --- TRL side ----------------------------------------------------------------------------------------------------


def run_trl(
    args: argparse.Namespace, folder: str, data: str, work: Path, gpu: bool, micro_batch: int
) -> dict[str, Any]:
    from kuberl.trainer.rollout.weight_sync import free_port

    use_vllm = args.trl_generation == "vllm"
    config = {
        "model": folder,
        "data": data,
        "output_dir": str(work / "trl-run"),
        "result": str(work / f"trl-mb{micro_batch}.json"),
        "gpu": gpu,
        "use_vllm": use_vllm,
        "prompts": args.prompts,
        "group": args.group,
        "micro_batch": micro_batch,
        "max_prompt": args.max_prompt,
        "max_response": args.max_response,
        "steps": args.steps,
        "lr": args.lr,
        "seed": args.seed,
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    config_path = work / f"trl-config-mb{micro_batch}.json"
    config_path.write_text(json.dumps(config, indent=2))
    Path(config["result"]).unlink(missing_ok=True)
    env = {**os.environ, **OFFLINE_ENV}
    if use_vllm:  # TRL's colocate mode builds vLLM with the external_launcher executor: a torchrun-style world of 1
        env.update({k: v for k, v in VLLM_DEFAULT_ENV.items() if k not in os.environ})
        env.update(
            {
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
            }
        )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(config_path)]
    result: dict[str, Any] = {
        "generation": "vllm colocate" if use_vllm else "transformers generate",
        "config_file": str(config_path),
        **run_side(cmd, work, f"trl-mb{micro_batch}", env, args.timeout),
    }
    shutil.rmtree(config["output_dir"], ignore_errors=True)
    if Path(config["result"]).exists():
        child = json.loads(Path(config["result"]).read_text())
        result.update(child)
    result.setdefault("steps", [])
    for step in result["steps"]:  # TRL times its generation (with the weight sync into vLLM) and the rest
        step["breakdown_s"] = {"generation": step["gen_s"], "training": round(step["seconds"] - step["gen_s"], 3)}
    return measured(result, args.steps)


def trl_child(config_path: str) -> int:
    """Train with TRL's GRPOTrainer as ``config_path`` says; write per-step tokens and times to its ``result``."""
    import pyarrow.parquet as pq
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from kuberl.trainer.rewards.functions import load_reward_function

    c = json.loads(Path(config_path).read_text())
    reward_fn = load_reward_function("gsm8k")

    def gsm8k_reward(completions: list, data_source: list, reward_model: list, **_: Any) -> list[float]:
        texts = [m[-1]["content"] if isinstance(m, list) else m for m in completions]
        return [
            float(reward_fn(src, text, rm["ground_truth"]))
            for src, text, rm in zip(data_source, texts, reward_model, strict=True)
        ]

    class StepClock(TrainerCallback):
        """Wall time and tokens of each optimizer step (TRL generates at the first micro-step of each)."""

        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []
            self.logs: list[dict[str, Any]] = []
            self.gen_s = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.begin, self.tokens0, self.gen_s = time.perf_counter(), state.num_input_tokens_seen, 0.0

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the step's kernels count in this step, not the next
            seconds = time.perf_counter() - self.begin
            tokens = int(state.num_input_tokens_seen - self.tokens0)
            self.steps.append(
                {
                    "step": state.global_step,
                    "tokens": tokens,
                    "seconds": round(seconds, 3),
                    "tokens_per_s": round(tokens / seconds, 1),
                    "gen_s": round(self.gen_s, 3),
                }
            )

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **_: Any) -> None:
            self.logs.append({"step": state.global_step, **(logs or {})})

    rows = pq.read_table(c["data"]).to_pylist()
    total = c["prompts"] * c["group"]
    config = GRPOConfig(
        output_dir=c["output_dir"],
        max_steps=c["steps"],
        per_device_train_batch_size=c["micro_batch"],
        gradient_accumulation_steps=total // c["micro_batch"],
        num_generations=c["group"],
        max_completion_length=c["max_response"],
        learning_rate=c["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        beta=0.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        gradient_checkpointing=False,
        bf16=c["gpu"],
        use_cpu=not c["gpu"],
        seed=c["seed"],
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_vllm=c["use_vllm"],
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=c["gpu_memory_utilization"],
        vllm_max_model_length=c["max_prompt"] + c["max_response"],
    )
    clock = StepClock()
    # fp32 weights (bf16 autocast on a GPU) like kuberl's FSDP2 actor; loaded here because TRL's own loader needs
    # config.architectures, which tiny:// folders lack
    model = AutoModelForCausalLM.from_pretrained(c["model"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=gsm8k_reward, args=config, train_dataset=Dataset.from_list(rows), callbacks=[clock]
    )
    generate = trainer._generate_single_turn  # generation (+ weight sync into vLLM) time per step, for the record

    def timed_generate(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            clock.gen_s += time.perf_counter() - start

    trainer._generate_single_turn = timed_generate
    start = time.perf_counter()
    trainer.train()
    by_step = {log["step"]: log for log in clock.logs if "num_tokens" in log}  # not the closing summary
    for s in clock.steps:
        log = by_step.get(s["step"], {})
        s["response_length_mean"] = log.get("completions/mean_length")
        s["reward_mean"] = log.get("reward")
        s["trl_step_time"] = log.get("step_time")
    result = {
        "version": trl.__version__,
        "train_wall_s": round(time.perf_counter() - start, 1),
        "steps": clock.steps,
        "logs": clock.logs,
        "config": {
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "generation_batch_size": config.generation_batch_size,
            "num_generations": config.num_generations,
            "loss_type": config.loss_type,
            "beta": config.beta,
            "bf16": config.bf16,
            "use_vllm": config.use_vllm,
            "vllm_mode": config.vllm_mode if config.use_vllm else None,
            "vllm_gpu_memory_utilization": config.vllm_gpu_memory_utilization,
            "vllm_importance_sampling_correction": config.vllm_importance_sampling_correction,
            "torch_dtype_of_weights": str(next(trainer.model.parameters()).dtype),
            "device": str(trainer.accelerator.device),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
    }
    Path(c["result"]).write_text(json.dumps(result, indent=2))
    return 0


# --- driver ------------------------------------------------------------------------------------------------------


def run_trl_sweep(
    args: argparse.Namespace, folder: str, data: str, work: Path, gpu: bool, micro_batches: list[int]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """TRL once per micro-batch; (the fastest run, every run). A run that ran out of memory is marked ``oom``; one
    stopped by SIGTERM is the sweep's last."""
    runs = []
    for micro_batch in micro_batches:
        print(f"running trl at {micro_batch} rows per micro-batch ...", flush=True)
        result = run_trl(args, folder, data, work, gpu, micro_batch)
        result["micro_batch"] = micro_batch
        result["oom"] = any(text in result.get("error", "") for text in OUT_OF_MEMORY)
        print_side(f"trl (micro-batch {micro_batch})", result, args.out)
        runs.append(result)
        if result.get("stopped"):
            break
    return fastest(runs), runs


def fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of the most tokens/s; the last one when none finished."""
    done = [r for r in runs if "error" not in r]
    return max(done, key=lambda r: r["tokens_per_s"]) if done else runs[-1]


def merge_trl_sweep(result: dict[str, Any], earlier: Earlier | None) -> None:
    """TRL's runs of ``earlier`` beside this run's (this run's win for the same micro-batch); the fastest of all is
    the side ``trl``."""
    if earlier is None:
        return
    runs = {r["micro_batch"]: r for r in earlier.doc.get("trl_sweep", [])}
    runs.update({r["micro_batch"]: r for r in result.get("trl_sweep", [])})
    if runs:
        result["trl_sweep"] = [runs[m] for m in sorted(runs)]
        result["trl"] = fastest(result["trl_sweep"])


def merged(result: dict[str, Any], earlier: Earlier | None) -> dict[str, Any]:
    """``result`` with the kuberl sides and TRL runs of ``earlier`` it lacks."""
    whole = merge_sides(result, earlier, tuple(KUBERL_SIDES))
    merge_trl_sweep(whole, earlier)
    return whole


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(parser)
    parser.add_argument("--trl-generation", choices=["vllm", "hf"], help="default: vllm on a GPU, hf on CPU")
    parser.add_argument(
        "--trl-micro-batches",
        type=int,
        nargs="+",
        help="TRL's responses per forward/backward pass, one run each; the ratio is taken against the fastest "
        "(default: --micro-batch)",
    )
    parser.add_argument("--only", choices=["kuberl", "trl"], help="run one side (no ratio)")
    parser.add_argument("--out", default="bench/results/grpo_vs_trl.json")
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)  # child mode: run the TRL side from this config
    args = parser.parse_args()
    stop_on_sigterm()
    if args.trl_child:
        return trl_child(args.trl_child)
    check_steps(parser, args)
    total = args.prompts * args.group
    micro_batches = [min(m, total) for m in (args.trl_micro_batches or [args.micro_batch])]
    if any(total % m for m in micro_batches):
        parser.error(f"every TRL micro-batch must divide prompts × group = {total}: {micro_batches}")

    import torch

    gpu = torch.cuda.is_available()
    card = gpu_name() if gpu else None
    args.trl_generation = args.trl_generation or ("vllm" if gpu else "hf")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="grpo-vs-trl-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    folder = model_folder_of(args.model, work)
    data = write_data(folder, work / "train.parquet", args.prompts * (args.steps + 1), args.max_prompt, args.seed)
    print(
        f"model {args.model} → {folder} and {data['rows']} prompts ready in {time.perf_counter() - start:.1f} s; "
        f"logs in {work}",
        flush=True,
    )
    settings = {**job_settings(args, gpu, data), "trl_micro_batches": micro_batches}
    result = result_header(BENCHMARK, args, card=card, folder=folder, work=work, settings=settings, packages=PACKAGES)
    result["tokens_per_s"] += "; TRL's fastest micro-batch"
    kuberl_sides = OVERLAP_ROWS[args.overlap]
    sides = [*kuberl_sides, "trl"]
    if args.only:
        sides = kuberl_sides if args.only == "kuberl" else ["trl"]
    earlier = read_earlier(args.merge_with, result)
    for side in sides:
        if side == "trl":
            result["trl"], result["trl_sweep"] = run_trl_sweep(args, folder, data["file"], work, gpu, micro_batches)
        else:
            print(f"running {side} ...", flush=True)
            result[side] = run_kuberl(args, folder, data["file"], work, gpu, card, side)
            print_side(side, result[side], args.out)
        write_result(merged(result, earlier), args.out)  # a run stopped later keeps the sides that finished
        end_if_stopped(*(result["trl_sweep"] if side == "trl" else [result[side]]))

    result = merged(result, earlier)
    for side in kuberl_sides:
        for step in result.get(side, {}).get("steps", []):
            phases = " ".join(f"{k} {v:.2f}" for k, v in step["breakdown_s"].items())
            print(f"{side} step {step['step']}: {step['seconds']:.2f} s, staleness {step['staleness']}; {phases}")
    theirs = result.get("trl", {}).get("tokens_per_s")
    for side in KUBERL_SIDES:
        ours = result.get(side, {}).get("tokens_per_s")
        if ours and theirs:
            key = "ratio" if side == "kuberl" else f"ratio_{side}"
            result[key] = round(ours / theirs, 3)
            print(
                f"{side} ÷ TRL tokens/s: {result[key]:.2f} ({side} {ours:.0f} tok/s, TRL {theirs:.0f} tok/s at "
                f"{result['trl']['micro_batch']} rows per micro-batch, TRL generation: {result['trl']['generation']})"
            )
    print_async_ratios(result)
    ok = all("error" not in result[side] for side in sides)
    write_result(result, args.out)
    return 0 if ok else 1


def print_async_ratios(result: dict[str, Any]) -> None:
    """The asynchronous rows against the one-step-off row of the same run (``ratio_<side>_vs_overlap``)."""
    print_ratios(result, tuple(s for s in KUBERL_SIDES if s.startswith("kuberl_async")), "kuberl_overlap", "overlap")


if __name__ == "__main__":
    sys.exit(main())
