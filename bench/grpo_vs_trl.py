"""Benchmark (b): end-to-end GRPO tokens/s of ``kuberl run`` ÷ TRL's ``GRPOTrainer``, same model, batch, lengths, group.

Both sides train on the same generated GSM8K-style problems (``kuberl.trainer.datagen.gsm8k_synth``, prompts longer
than ``--max-prompt`` tokens dropped) with kuberl's builtin ``gsm8k`` reward, ``--steps`` steps of ``--prompts``
prompts × ``--group`` samples, responses ≤ ``--max-response`` tokens, temperature 1, no KL term, constant ``--lr``,
no weight decay, no gradient checkpointing, one optimizer step per step. Each side cuts the step into micro-batches
its recommended way: kuberl by a token budget (``batch.dynamicBatchSize``, ``--max-tokens`` packed tokens per pass;
``--max-tokens 0`` takes ``--micro-batch`` responses instead), TRL by ``--micro-batch`` responses (it has no token
budget). Each side runs in a fresh subprocess, one after the other, so GPU memory is released in between:

- kuberl: an RLJob written from these settings, ``python -m kuberl.cli run SPEC --run-dir DIR --no-progress``;
  ``rollout.engine vllm`` colocated (``gpuMemoryUtilization`` ``--gpu-memory-utilization``, rollout log-probs on,
  CUDA graphs on) on a GPU, ``hf`` on CPU. Per step: ``perf/total_num_tokens`` and ``timing_s/step`` from
  ``metrics.jsonl``, and the step's breakdown (generation, log-probs, update, sync, idle wait for generation,
  overlap).
- kuberl one-step-off-policy (``--overlap on`` or ``both``, side ``kuberl_overlap``): the same RLJob with
  ``rollout.placement separate`` (on one GPU the engine shares the card in its own process, weights by CUDA IPC; on
  CPU a separate ``hf`` engine) and ``rollout.overlap oneStepOffPolicy`` with ``algorithm.rolloutCorrection``: the
  next batch is generated while the trainer updates on this one, so a step's wall time holds only the part of the
  generation that outlasts the update (``idle``).
- TRL: ``GRPOTrainer`` with ``per_device_train_batch_size`` = micro-batch, ``gradient_accumulation_steps`` =
  prompts × group ÷ micro-batch, ``num_generations`` = group, ``beta`` 0, bf16 autocast over fp32 weights on a GPU;
  generation ``--trl-generation vllm`` (``use_vllm``, ``vllm_mode="colocate"``, the same memory fraction; TRL's
  defaults otherwise, e.g. importance-sampling correction on) or ``hf`` (transformers ``generate``). Per step: a
  callback times ``on_step_begin`` → ``on_step_end`` and takes the growth of ``state.num_input_tokens_seen``.

Tokens count the same on both sides: prompt + response tokens (padding excluded, eos included) of every sampled
response, i.e. each prompt once per sample. tokens/s of a side = tokens ÷ seconds summed over steps 2…N (step 1
warms up and is left out; the one-step-off-policy side also leaves out step N, which generates nothing ahead). The two sides draw prompts from the same file in their own shuffled orders. A side that
fails or outlives ``--timeout`` is recorded with the tail of its stderr; the JSON is written anyway and the exit
code is 1. Usage (GPU machine, docs/gpu.md; TRL and the wheels it needs there from ``.device/x-trl``)::

    python bench/grpo_vs_trl.py --model smollm2 --steps 5 --prompts 32 --group 8 --max-prompt 256 \\
        --max-response 256 --out bench/results/grpo_vs_trl.json
    python bench/grpo_vs_trl.py --model shape:llama-1.1b --work-dir /tmp/bench-1b ...   # the 1.14B random llama
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHAPE_PREFIX = "shape:"

PACKAGES = ("torch", "transformers", "vllm", "ray", "trl", "accelerate", "datasets", "kuberl")
ERROR_TAIL_LINES = 40
CHECKPOINTS = "runs/grpo-vs-trl/checkpoints"  # relative: under the repository (the kuberl side's working directory)
VLLM_DEFAULT_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}  # vLLM's external_launcher requires the last one
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


# --- shared ------------------------------------------------------------------------------------------------------


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def summarise(steps: list[dict[str, Any]], *, generates_ahead: bool = False) -> dict[str, Any]:
    """Per-step tokens and seconds → tokens/s over steps 2…N (sum ÷ sum) and the mean of those steps' rates.

    ``generates_ahead`` (one-step-off-policy): steps 2…N−1 only. The last step of an overlapped run generates no
    next batch, so it is shorter than a steady-state step and would flatter the rate."""
    measured = steps[1:-1] if generates_ahead else steps[1:]
    if not measured:
        raise ValueError(
            f"need at least {3 if generates_ahead else 2} steps: step 1 is warm-up"
            + (" and the last generates nothing ahead" if generates_ahead else "")
        )
    tokens = sum(s["tokens"] for s in measured)
    seconds = sum(s["seconds"] for s in measured)
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "tokens_per_s_mean_of_steps": round(sum(s["tokens_per_s"] for s in measured) / len(measured), 1),
        "measured_steps": [s["step"] for s in measured],
        "measured_tokens": tokens,
        "measured_seconds": round(seconds, 3),
    }


def measured(result: dict[str, Any], steps: int, *, generates_ahead: bool = False) -> dict[str, Any]:
    """Add the summary when every step was recorded, even if the process failed afterwards (e.g. at teardown)."""
    if len(result["steps"]) == steps:
        result.update(summarise(result["steps"], generates_ahead=generates_ahead))
    elif "error" not in result:
        result["error"] = f"{len(result['steps'])} of {steps} steps recorded"
    return result


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], check=False, capture_output=True, text=True
    )
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None


def wait_for_gpu_memory(limit_mib: int = 2048, timeout_s: float = 60.0) -> float | None:
    """Wait until the GPU holds less than ``limit_mib`` (the previous side's processes are gone); MiB used then."""
    if not shutil.which("nvidia-smi"):
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            check=False,
            capture_output=True,
            text=True,
        )
        used = float(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else 0.0
        if used < limit_mib or time.monotonic() > deadline:
            return used
        time.sleep(1.0)


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_side(cmd: list[str], log_dir: Path, name: str, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """Run one side in its own process group; stdout and stderr to ``log_dir/NAME.{out,err}``."""
    out_path, err_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
    start = time.perf_counter()
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
    info: dict[str, Any] = {
        "command": " ".join(cmd),
        "exit_code": code,
        "wall_s": round(time.perf_counter() - start, 1),
        "stdout_log": str(out_path),
        "stderr_log": str(err_path),
    }
    if code != 0:
        why = f"timed out after {timeout_s:.0f} s" if code is None else f"exit code {code}"
        info["error"] = f"{name} {why}; tail of stderr:\n{tail(err_path) or tail(out_path)}"
    return info


# --- data and model ----------------------------------------------------------------------------------------------


def write_data(folder: str, path: Path, rows_wanted: int, max_prompt: int, seed: int) -> dict[str, Any]:
    """gsm8k_synth rows whose chat-templated prompt fits ``max_prompt`` tokens (both sides read the same file)."""
    from kuberl.trainer.datagen import gsm8k_synth, write_rows
    from kuberl.trainer.models import load_tokenizer

    tokenizer = load_tokenizer(folder)
    rows, lengths = [], []
    pool = 10 * rows_wanted
    for row in gsm8k_synth(pool, seed=seed, split="train"):
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
        if len(ids) <= max_prompt:
            rows.append(row)
            lengths.append(len(ids))
        if len(rows) == rows_wanted:
            break
    if len(rows) < rows_wanted:
        raise ValueError(
            f"only {len(rows)} of {pool} generated prompts fit --max-prompt {max_prompt} tokens; raise --max-prompt"
        )
    write_rows(rows, str(path))
    return {
        "file": str(path),
        "rows": len(rows),
        "prompt_tokens_mean": round(sum(lengths) / len(lengths), 1),
        "prompt_tokens_max": max(lengths),
    }


# --- kuberl side -------------------------------------------------------------------------------------------------


def kuberl_spec(args: argparse.Namespace, folder: str, data: str, gpu: bool, overlap: bool = False) -> dict[str, Any]:
    """``overlap``: the one-step-off-policy variant (separate placement, rollout.overlap, rollout correction)."""
    doc = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "grpo-vs-trl"},
        "spec": {
            "model": {"path": folder, "dtype": "bfloat16" if gpu else "float32", "gradientCheckpointing": False},
            "algorithm": {"advantageEstimator": "grpo"},  # KL loss and KL-in-reward are off by default
            "data": {
                "trainFiles": [data],
                "maxPromptLength": args.max_prompt,
                "maxResponseLength": args.max_response,
                "seed": args.seed,
            },
            "reward": {"function": "gsm8k"},
            "batch": {
                "trainBatchSize": args.prompts,
                "rolloutN": args.group,
                "ppoMiniBatchSize": args.prompts,
                **(
                    {"dynamicBatchSize": {"enabled": True, "maxTokenLenPerGPU": args.max_tokens}}
                    if args.max_tokens
                    else {"ppoMicroBatchSizePerGPU": args.micro_batch}
                ),
            },
            "rollout": (
                {
                    "engine": "vllm",
                    "placement": "colocated",
                    "gpuMemoryUtilization": args.gpu_memory_utilization,
                    "calculateLogProbs": True,
                    "enforceEager": args.kuberl_enforce_eager,
                    "temperature": 1.0,
                }
                if gpu
                else {"engine": "hf", "temperature": 1.0}
            ),
            "actor": {"optim": {"lr": args.lr, "weightDecay": 0.0}},
            "trainer": {
                "totalSteps": args.steps,
                "valBeforeTrain": False,
                "resume": "disable",
                "metricsPort": 0,
                "checkpointDir": CHECKPOINTS,
                "maxCheckpoints": 1,
                "loggers": ["console", "jsonl"],
            },
            "cluster": {
                "device": "cuda" if gpu else "cpu",
                "trainer": {"nodes": 1, "gpusPerNode": 1, "cpu": "2", "memory": "8Gi"},
            },
        },
    }
    if overlap:
        spec = doc["spec"]
        spec["rollout"].update(placement="separate", overlap="oneStepOffPolicy", calculateLogProbs=True)
        spec["algorithm"]["rolloutCorrection"] = {"enabled": True}
        spec["cluster"]["rollout"] = {"nodes": 1, "gpusPerNode": 1, "cpu": "2", "memory": "8Gi"}
    return doc


BREAKDOWN = {
    "generation": ("timing_s/gen", "timing_s/gen_max"),
    "reward": ("timing_s/reward",),
    "log_probs": ("timing_s/old_log_prob", "timing_s/ref", "timing_s/values"),
    "update": ("timing_s/update_actor", "timing_s/update_critic", "timing_s/adv"),
    "sync": ("timing_s/update_weights",),
    "idle": ("timing_s/gen_wait",),
    "overlap": ("timing_s/overlap",),
}
"""A step's seconds by phase, from its metrics. Synchronous, generation and reward are part of the step; one step
off policy they ran during the previous step (``overlap`` of that step) and the step holds ``idle`` instead: the
trainer's wait for a generation that outlasted its passes."""


def breakdown(metrics: dict[str, Any]) -> dict[str, float]:
    return {phase: round(sum(metrics.get(k, 0.0) for k in keys), 3) for phase, keys in BREAKDOWN.items()}


def run_kuberl(
    args: argparse.Namespace, folder: str, data: str, work: Path, gpu: bool, overlap: bool = False
) -> dict[str, Any]:
    import yaml

    name = "kuberl-overlap" if overlap else "kuberl"
    run_dir = work / f"{name}-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl is appended to
    spec = kuberl_spec(args, folder, data, gpu, overlap)
    spec_path = work / f"{name}-rljob.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "kuberl.cli", "run", str(spec_path), "--run-dir", str(run_dir), "--no-progress"]
    env = {**os.environ, **OFFLINE_ENV}
    result: dict[str, Any] = {
        "engine": spec["spec"]["rollout"]["engine"],
        "placement": spec["spec"]["rollout"].get("placement", "colocated"),
        "overlap": spec["spec"]["rollout"].get("overlap", "none"),
        "spec_file": str(spec_path),
        "spec": spec["spec"],
        **run_side(cmd, work, name, env, args.timeout),
    }
    shutil.rmtree(ROOT / CHECKPOINTS, ignore_errors=True)
    metrics_path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    steps = [
        {
            "step": m["step"],
            "tokens": int(m["perf/total_num_tokens"]),
            "seconds": round(m["timing_s/step"], 3),
            "tokens_per_s": round(m["perf/total_num_tokens"] / m["timing_s/step"], 1),
            "gen_s": round(m.get("timing_s/gen", 0.0) + m.get("timing_s/update_weights", 0.0), 3),
            "response_length_mean": m.get("response_length/mean"),
            "reward_mean": m.get("critic/score/mean"),
            "staleness": m.get("rollout/staleness"),
            "breakdown_s": breakdown(m),
        }
        for m in lines
        if "perf/total_num_tokens" in m
    ]
    result["steps"] = steps
    return measured(result, args.steps, generates_ahead=overlap)


# --- TRL side ----------------------------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace, folder: str, data: str, work: Path, gpu: bool) -> dict[str, Any]:
    from kuberl.trainer.weight_sync import free_port

    use_vllm = args.trl_generation == "vllm"
    config = {
        "model": folder,
        "data": data,
        "output_dir": str(work / "trl-run"),
        "result": str(work / "trl.json"),
        "gpu": gpu,
        "use_vllm": use_vllm,
        "prompts": args.prompts,
        "group": args.group,
        "micro_batch": args.micro_batch,
        "max_prompt": args.max_prompt,
        "max_response": args.max_response,
        "steps": args.steps,
        "lr": args.lr,
        "seed": args.seed,
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }
    config_path = work / "trl-config.json"
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
        **run_side(cmd, work, "trl", env, args.timeout),
    }
    shutil.rmtree(config["output_dir"], ignore_errors=True)
    if Path(config["result"]).exists():
        child = json.loads(Path(config["result"]).read_text())
        result.update(child)
    result.setdefault("steps", [])
    return measured(result, args.steps)


def trl_child(config_path: str) -> int:
    """Train with TRL's GRPOTrainer as ``config_path`` says; write per-step tokens and times to its ``result``."""
    import pyarrow.parquet as pq
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from kuberl.trainer.rewards import load_reward_function

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


def shape_folder(model: str, work: Path) -> str:
    """The HF folder of ``shape:NAME`` under ``work``, written once (seeded random weights: same model every time);
    written beside it and renamed, so a run killed half-way leaves no folder that looks complete."""
    from bench.shapes import RANDOM, save_random

    name = model.removeprefix(SHAPE_PREFIX)
    if name not in RANDOM:
        raise SystemExit(f"--model {model}: no shape {name!r} in bench/shapes.py; known: {', '.join(sorted(RANDOM))}")
    folder = work / f"model-{name}"
    if not folder.exists():
        partial = work / f".model-{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        save_random(name, str(partial), tokenizer="smollm2")
        partial.rename(folder)
    return str(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="smollm2",
        help=f"model.path (smollm2, a HF folder, a .gguf, tiny://…) or {SHAPE_PREFIX}NAME: a random-weight model of "
        "bench/shapes.py's shape NAME (e.g. llama-1.1b) with SmolLM2's tokenizer, built under --work-dir",
    )
    parser.add_argument("--steps", type=int, default=5, help="training steps per side; step 1 is not measured")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step (kuberl trainBatchSize)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (rolloutN, num_generations)")
    parser.add_argument("--max-prompt", type=int, default=256)
    parser.add_argument("--max-response", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=32, help="TRL's responses per forward/backward pass")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=32768,
        help="kuberl's packed tokens per forward/backward pass (0: --micro-batch responses, as TRL)",
    )
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share, both sides")
    parser.add_argument("--trl-generation", choices=["vllm", "hf"], help="default: vllm on a GPU, hf on CPU")
    parser.add_argument(
        "--kuberl-enforce-eager",
        action="store_true",
        help="kuberl's vLLM without CUDA graphs (TRL's engine always has them)",
    )
    parser.add_argument(
        "--overlap",
        choices=["off", "on", "both"],
        default="off",
        help="kuberl synchronous (off), one-step-off-policy on a separate engine (on), or both rows (both)",
    )
    parser.add_argument("--only", choices=["kuberl", "trl"], help="run one side (no ratio)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per side before it is killed")
    parser.add_argument("--work-dir", help="spec, data, logs (default: a new temporary folder)")
    parser.add_argument("--out", default="bench/results/grpo_vs_trl.json")
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)  # child mode: run the TRL side from this config
    args = parser.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child)

    total = args.prompts * args.group
    if args.steps < (3 if args.overlap != "off" else 2):
        parser.error(
            "--steps must be at least 2 (3 with --overlap): step 1 is warm-up, an overlapped run's last step "
            "generates nothing ahead; neither is measured"
        )
    args.micro_batch = min(args.micro_batch, total)
    if total % args.micro_batch:
        parser.error(f"--micro-batch {args.micro_batch} must divide prompts × group = {total}")

    import torch

    from kuberl.trainer.rollout.vllm import model_folder

    gpu = torch.cuda.is_available()
    args.trl_generation = args.trl_generation or ("vllm" if gpu else "hf")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="grpo-vs-trl-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    folder = shape_folder(args.model, work) if args.model.startswith(SHAPE_PREFIX) else model_folder(args.model)
    data = write_data(folder, work / "train.parquet", args.prompts * (args.steps + 1), args.max_prompt, args.seed)
    print(
        f"model {args.model} → {folder} and {data['rows']} prompts ready in {time.perf_counter() - start:.1f} s; "
        f"logs in {work}",
        flush=True,
    )

    result: dict[str, Any] = {
        "benchmark": "end-to-end GRPO tokens/s, kuberl run ÷ TRL GRPOTrainer",
        "date": time.strftime("%Y-%m-%d"),
        "device": gpu_name() if gpu else "cpu",
        "model": args.model,
        "model_folder": folder,
        "versions": versions(),
        "work_dir": str(work),
        "settings": {
            "steps": args.steps,
            "prompts": args.prompts,
            "group": args.group,
            "responses_per_step": total,
            "micro_batch": args.micro_batch,
            "kuberl_max_tokens": args.max_tokens or None,
            "max_prompt": args.max_prompt,
            "max_response": args.max_response,
            "lr": args.lr,
            "seed": args.seed,
            "temperature": 1.0,
            "kl": "off (kuberl kl.loss disabled, TRL beta 0)",
            "dtype": "bf16 over fp32" if gpu else "fp32",
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "data": data,
        },
        "tokens": "prompt + response tokens (eos included, padding excluded) of every response, per step",
        "tokens_per_s": "sum of tokens ÷ sum of step seconds over steps 2…N (step 1 is warm-up); 2…N−1 for "
        "kuberl_overlap (its step N generates nothing ahead)",
    }
    kuberl_sides = {"off": ["kuberl"], "on": ["kuberl_overlap"], "both": ["kuberl", "kuberl_overlap"]}[args.overlap]
    sides = [*kuberl_sides, "trl"]
    if args.only:
        sides = kuberl_sides if args.only == "kuberl" else ["trl"]
    for side in sides:
        if side != sides[0]:
            result[f"gpu_mib_used_before_{side}"] = wait_for_gpu_memory()
        print(f"running {side} ...", flush=True)
        if side == "trl":
            result[side] = run_trl(args, folder, data["file"], work, gpu)
        else:
            result[side] = run_kuberl(args, folder, data["file"], work, gpu, overlap=side == "kuberl_overlap")
        error = result[side].get("error")
        lines = error.splitlines() if error else []
        summary = (
            f"{lines[0]} … {lines[-1]} (more in {args.out})"
            if error
            else f"{result[side]['tokens_per_s']:.0f} tokens/s"
        )
        print(f"{side}: {summary} ({result[side]['wall_s']} s)", flush=True)

    ok = all("error" not in result[side] for side in sides)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for side in kuberl_sides:
        for step in result.get(side, {}).get("steps", []):
            phases = " ".join(f"{k} {v:.2f}" for k, v in step["breakdown_s"].items())
            print(f"{side} step {step['step']}: {step['seconds']:.2f} s, staleness {step['staleness']}; {phases}")
    theirs = result.get("trl", {}).get("tokens_per_s")
    for side in kuberl_sides:
        ours = result.get(side, {}).get("tokens_per_s")
        if ours and theirs:
            key = "ratio" if side == "kuberl" else f"ratio_{side}"
            result[key] = round(ours / theirs, 3)
            print(
                f"{side} ÷ TRL tokens/s: {result[key]:.2f} ({side} {ours:.0f} tok/s, TRL {theirs:.0f} tok/s, "
                f"TRL generation: {result['trl']['generation']})"
            )
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
