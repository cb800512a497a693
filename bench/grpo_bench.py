"""What the end-to-end GRPO benchmarks share (``grpo_vs_trl.py``, ``grpo_vs_verl.py``): the job's settings, the data,
the kuberl side, running a side in its own process while NVML samples the card, and the tokens/s summary.

Every side of every benchmark runs the same job: ``--steps`` steps of ``--prompts`` GSM8K-style prompts × ``--group``
samples, responses ≤ ``--max-response`` tokens, temperature 1, no KL term, constant ``--lr``, no weight decay, no
gradient checkpointing, one optimizer step per step, bf16 compute over fp32 weights on a GPU, vLLM at
``--gpu-memory-utilization`` of the card with CUDA graphs. tokens/s of a side = prompt + response tokens (eos
included, padding excluded) of every sample, summed over steps 2…N, ÷ their summed step seconds (step 1 warms up;
a side that generates ``a`` batches ahead — 1 one step off, k async — is measured over steps a + 2 … N − a:
the first a after the warm-up take batches generated during it, the last a generate nothing ahead).

While a side runs, a thread reads the card's memory in use from NVML every ``NVML_INTERVAL_S`` (the whole device,
every process: trainer, engines, Ray), the figure ``kuberl plan`` is checked against
(``tests/api/test_memory_measured.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPE_PREFIX = "shape:"
ERROR_TAIL_LINES = 40
GIB = 2**30
NVML_INTERVAL_S = 0.1
IDLE_CARD_MIB = 2048
"""Less than this in use is an idle card (its driver's share: ~0.5 GiB on an H100)."""
IDLE_WAIT_S = 60.0
"""How long a side waits for the previous side's processes to leave the card."""
CHECKPOINTS = "runs/grpo-bench/checkpoints"  # relative: under the repository (the kuberl side's working directory)
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


# --- the job -----------------------------------------------------------------------------------------------------


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings every side shares."""
    parser.add_argument(
        "--model",
        default="smollm2",
        help=f"model.path (smollm2, a HF folder, a .gguf, tiny://…) or {SHAPE_PREFIX}NAME: a random-weight model of "
        "bench/shapes.py's shape NAME (e.g. llama-1.1b) with SmolLM2's tokenizer, built under --work-dir",
    )
    parser.add_argument("--steps", type=int, default=5, help="training steps per side; step 1 is not measured")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step (trainBatchSize)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (rolloutN)")
    parser.add_argument("--max-prompt", type=int, default=256)
    parser.add_argument("--max-response", type=int, default=256)
    parser.add_argument(
        "--max-tokens",
        default="auto",
        help="kuberl's packed tokens per forward/backward pass (batch.dynamicBatchSize.maxTokenLenPerGPU): a number, "
        "auto (kuberl chooses from its memory plan of the card), or 0 for --micro-batch responses per pass",
    )
    parser.add_argument("--micro-batch", type=int, default=32, help="responses per pass where a side takes a count")
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of the card")
    parser.add_argument(
        "--overlap",
        choices=list(OVERLAP_ROWS),
        default="off",
        help="synchronous rows (off), the one-step-off rows (on: generation beside training), both, the "
        "asynchronous rows at maxStaleness 1 and 2 and 2 with partial rollouts beside the one-step-off one (async; "
        "async-k2 without k = 1), or every row (all)",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per side before it is killed")
    parser.add_argument("--work-dir", help="specs, data, logs (default: a new temporary folder)")
    parser.add_argument(
        "--merge-with",
        help="an earlier result of the same script, model and card: its sides that this run does not run are kept, "
        "and the ratios taken over both (a benchmark split over several calls of a time-limited machine)",
    )


def token_budget(value: str) -> int | str | None:
    """``--max-tokens``: a number of tokens, ``auto``, or None (``0``: a row count instead)."""
    if value == "auto":
        return "auto"
    tokens = int(value)
    return tokens or None


def check_steps(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    ahead = max(batches_ahead(side) for side in OVERLAP_ROWS[args.overlap])
    if args.steps < fewest_steps(ahead):
        parser.error(
            f"--steps must be at least {fewest_steps(ahead)} with --overlap {args.overlap}: step 1 is warm-up, and a "
            f"row that generates {ahead} batch(es) ahead is measured over steps {ahead + 2} … N − {ahead} (summarise)"
        )
    total = args.prompts * args.group
    args.micro_batch = min(args.micro_batch, total)
    if total % args.micro_batch:
        parser.error(f"--micro-batch {args.micro_batch} must divide prompts × group = {total}")


def job_settings(args: argparse.Namespace, gpu: bool, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "steps": args.steps,
        "prompts": args.prompts,
        "group": args.group,
        "responses_per_step": args.prompts * args.group,
        "micro_batch": args.micro_batch,
        "kuberl_max_tokens": token_budget(args.max_tokens),
        "max_prompt": args.max_prompt,
        "max_response": args.max_response,
        "lr": args.lr,
        "seed": args.seed,
        "temperature": 1.0,
        "kl": "off",
        "dtype": "bf16 over fp32" if gpu else "fp32",
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "data": data,
    }


TOKENS = "prompt + response tokens (eos included, padding excluded) of every response, per step"
TOKENS_PER_S = (
    "sum of tokens ÷ sum of step seconds over steps 2…N (step 1 is warm-up); a + 2 … N − a for a side that "
    "generates a batches ahead (1 one step off, k async): the first a after step 1 take the batches generated "
    "during it, the last a generate nothing ahead"
)


def result_header(
    benchmark: str,
    args: argparse.Namespace,
    *,
    card: str | None,
    folder: str,
    work: Path,
    settings: dict[str, Any],
    packages: tuple[str, ...],
) -> dict[str, Any]:
    """What every result records first: the benchmark, date, card, model, versions, command and settings."""
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%d"),
        "device": card or "cpu",
        "model": args.model,
        "model_folder": folder,
        "versions": versions(packages),
        "command": " ".join(sys.argv),
        "work_dir": str(work),
        "settings": settings,
        "tokens": TOKENS,
        "tokens_per_s": TOKENS_PER_S,
    }


def versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in packages:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


# --- data and model ----------------------------------------------------------------------------------------------


def shape_folder(model: str, work: Path) -> str:
    """The HF folder of ``shape:NAME`` under ``work``, written once (seeded random weights: same model every time);
    written beside it and renamed, so a run killed half-way leaves no folder that looks complete. Written by a child
    process: built in this one, the model's blocks stayed in its CUDA cache (5.3 GiB at llama-1.1b) beside every
    side's run, on the card and in its NVML peak."""
    from bench.shapes import RANDOM

    name = model.removeprefix(SHAPE_PREFIX)
    if name not in RANDOM:
        raise SystemExit(f"--model {model}: no shape {name!r} in bench/shapes.py; known: {', '.join(sorted(RANDOM))}")
    folder = work / f"model-{name}"
    if not folder.exists():
        partial = work / f".model-{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(
            [sys.executable, "-m", "bench.shapes", name, str(partial), "--tokenizer", "smollm2"], check=True, cwd=ROOT
        )
        partial.rename(folder)
    return str(folder)


def model_folder_of(model: str, work: Path) -> str:
    from kuberl.trainer.rollout.vllm import model_folder

    return shape_folder(model, work) if model.startswith(SHAPE_PREFIX) else model_folder(model)


def write_data(folder: str, path: Path, rows_wanted: int, max_prompt: int, seed: int) -> dict[str, Any]:
    """gsm8k_synth rows whose chat-templated prompt fits ``max_prompt`` tokens (every side reads the same rows)."""
    from kuberl.trainer.data.tasks import gsm8k_synth, write_rows
    from kuberl.trainer.model.loading import load_tokenizer

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


# --- running a side ----------------------------------------------------------------------------------------------


@dataclass
class DeviceMemory:
    """The card's memory in use (NVML, every process) while a side runs: the largest reading and the one before."""

    index: int = 0
    interval_s: float = NVML_INTERVAL_S
    before_bytes: int | None = None
    peak_bytes: int | None = None
    samples: int = 0
    process_peaks: dict[int, int] = field(default_factory=dict)
    """pid → largest memory NVML attributed to it (where the driver reports processes)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> DeviceMemory:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:  # no NVML (CPU machine): nothing to record
            return self
        self.before_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        self._thread = threading.Thread(target=self._sample, args=(pynvml, handle), daemon=True)
        self._thread.start()
        return self

    def _sample(self, pynvml: Any, handle: Any) -> None:
        while not self._stop.is_set():
            self.record(int(pynvml.nvmlDeviceGetMemoryInfo(handle).used), _processes(pynvml, handle))
            self._stop.wait(self.interval_s)

    def record(self, used: int, processes: dict[int, int]) -> None:
        self.samples += 1
        self.peak_bytes = max(self.peak_bytes or 0, used)
        for pid, used_by_pid in processes.items():
            self.process_peaks[pid] = max(self.process_peaks.get(pid, 0), used_by_pid)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def as_dict(self) -> dict[str, Any]:
        if self.peak_bytes is None:
            return {"available": False}
        return {
            "available": True,
            "device_peak_gib": round(self.peak_bytes / GIB, 3),
            "device_before_gib": round((self.before_bytes or 0) / GIB, 3),
            "samples": self.samples,
            "interval_s": self.interval_s,
            "process_peaks_gib": {
                str(pid): round(used / GIB, 3) for pid, used in sorted(self.process_peaks.items(), key=lambda x: -x[1])
            },
        }


def _processes(pynvml: Any, handle: Any) -> dict[int, int]:
    try:
        return {p.pid: int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:  # not reported inside some VMs
        return {}


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    names = _nvidia_smi("--query-gpu=name")
    return names.splitlines()[0].strip() if names.strip() else None


def busy_card() -> str | None:
    """None once the card holds less than :data:`IDLE_CARD_MIB` (the previous side's processes are gone), else what
    holds it after :data:`IDLE_WAIT_S`: a side measured beside another process would record that process's memory as
    its own peak and share the card's time with it."""
    if not shutil.which("nvidia-smi"):
        return None
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        used = _nvidia_smi("--query-gpu=memory.used")
        mib = float(used.split()[0]) if used.strip() else 0.0
        if mib < IDLE_CARD_MIB:
            return None
        if time.monotonic() > deadline:
            apps = _nvidia_smi("--query-compute-apps=pid,process_name,used_memory").strip().replace("\n", "; ")
            return (
                f"the card holds {mib:.0f} MiB after {IDLE_WAIT_S:.0f} s of waiting (pid, name, MiB: {apps or 'none'}); "
                "stop those processes (an earlier run's, e.g. one a killed call left) and run again"
            )
        time.sleep(1.0)


def _nvidia_smi(query: str) -> str:
    out = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], check=False, capture_output=True, text=True
    )
    return out.stdout if out.returncode == 0 else ""


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class Stopped(Exception):
    """SIGTERM reached the benchmark (an outer time limit such as the device script's ``timeout``, or a person): the
    side running is stopped and recorded with the steps it wrote, and no side after it starts."""


STOPPED_EXIT = 128 + signal.SIGTERM


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises :class:`Stopped` in the main thread, where :func:`run_side` waits for its side."""

    def raise_stopped(signum: int, frame: Any) -> None:
        raise Stopped

    signal.signal(signal.SIGTERM, raise_stopped)


def end_if_stopped(*sides: dict[str, Any]) -> None:
    """Called once a side's result is written: a side :class:`Stopped` ends the benchmark (exit 143), so that no
    later side starts."""
    if any(side.get("stopped") for side in sides):
        raise SystemExit(STOPPED_EXIT)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the side's process group, SIGKILL 20 s later if it still runs."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_side(
    cmd: list[str], log_dir: Path, name: str, env: dict[str, str], timeout_s: float, cwd: Path = ROOT
) -> dict[str, Any]:
    """Run one side in its own process group, stdout and stderr to ``log_dir/NAME.{out,err}``, with the card's
    memory sampled meanwhile (``nvml``); stopped at ``timeout_s``, or when the benchmark is :class:`Stopped`
    (``stopped`` in the result)."""
    out_path, err_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
    logs = {"command": " ".join(cmd), "stdout_log": str(out_path), "stderr_log": str(err_path)}
    busy = busy_card()
    if busy is not None:
        out_path.write_text("")
        err_path.write_text(busy + "\n")
        return {**logs, "exit_code": None, "wall_s": 0.0, "nvml": {}, "error": f"{name} not run: {busy}"}
    start = time.perf_counter()
    with out_path.open("w") as out, err_path.open("w") as err, DeviceMemory() as memory:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True)
        code: int | None = None
        stopped = False
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
        except Stopped:
            stopped = True
            _stop_group(proc)
    wall_s = round(time.perf_counter() - start, 1)
    info: dict[str, Any] = {**logs, "exit_code": code, "wall_s": wall_s, "nvml": memory.as_dict()}
    if stopped:
        info["stopped"] = True
    if code != 0:
        why = f"exit code {code}"
        if code is None:
            why = f"stopped by SIGTERM after {wall_s:.0f} s" if stopped else f"timed out after {timeout_s:.0f} s"
        info["error"] = f"{name} {why}; tail of stderr:\n{tail(err_path) or tail(out_path)}"
    return info


# --- the summary -------------------------------------------------------------------------------------------------


def fewest_steps(ahead: int, cycle: int = 1) -> int:
    """The fewest steps :func:`summarise` measures a side by: warm-up, ``ahead`` at each end, one ``cycle``."""
    return 2 * ahead + 1 + cycle


def summarise(steps: list[dict[str, Any]], *, ahead: int = 0, cycle: int = 1) -> dict[str, Any]:
    """Per-step tokens and seconds → tokens/s over the steady steps (sum ÷ sum) and the mean of those steps' rates.

    ``ahead``: the batches a side generates ahead of the step that trains (0 synchronous, 1 one step off, ``k`` for
    ``async`` at ``maxStaleness`` k). Step 1 is warm-up (compilation, CUDA graphs), and while it runs such a side
    builds up to ``ahead`` batches, which the next ``ahead`` steps take without waiting; the last ``ahead`` steps
    generate nothing more. Both flatter the rate, so steps ``ahead + 2 … N − ahead`` are measured. ``cycle``: a side
    whose steps repeat a pattern of that many (verl's ``colocate_async``: one step that waits for its generation,
    one that does not) is measured over whole cycles, the window's last steps that do not complete one left out."""
    window = steps[1 + ahead : len(steps) - ahead]
    measured_steps = window[: len(window) - len(window) % cycle]
    if not measured_steps:
        raise ValueError(
            f"need at least {fewest_steps(ahead, cycle)} steps: step 1 is warm-up"
            + (
                f", the next {ahead} take the batches generated during it, the last {ahead} generate none ahead"
                if ahead
                else ""
            )
            + (f", and the side is measured over whole cycles of {cycle} steps" if cycle > 1 else "")
        )
    tokens = sum(s["tokens"] for s in measured_steps)
    seconds = sum(s["seconds"] for s in measured_steps)
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "tokens_per_s_mean_of_steps": round(sum(s["tokens_per_s"] for s in measured_steps) / len(measured_steps), 1),
        "measured_steps": [s["step"] for s in measured_steps],
        "measured_tokens": tokens,
        "measured_seconds": round(seconds, 3),
        "phases_s": mean_phases(measured_steps),
    }


def mean_phases(steps: list[dict[str, Any]]) -> dict[str, float]:
    """The measured steps' mean seconds by phase."""
    phases = steps[0].get("breakdown_s", {})
    return {p: round(sum(s["breakdown_s"][p] for s in steps) / len(steps), 3) for p in phases}


def measured(result: dict[str, Any], steps: int, *, ahead: int = 0, cycle: int = 1) -> dict[str, Any]:
    """Add the summary when every step was recorded, even if the process failed afterwards (e.g. at teardown)."""
    if len(result["steps"]) == steps:
        result.update(summarise(result["steps"], ahead=ahead, cycle=cycle))
    elif "error" not in result:
        result["error"] = f"{len(result['steps'])} of {steps} steps recorded"
    return result


PHASES = ("generation", "reward", "log_probs", "update", "sync", "idle", "other")
"""A step's seconds by phase, the same names for every system. Synchronous, generation and reward are part of the
step; a side that generates ahead holds ``idle`` instead (the trainer's wait for a generation that outlasted its
passes). ``other`` is the rest of the step (batching, metrics, the driver)."""


def phase_breakdown(metrics: dict[str, Any], keys: dict[str, tuple[str, ...]], step_key: str) -> dict[str, float]:
    """``metrics``' seconds by :data:`PHASES`, ``keys`` naming the system's timing metrics of each phase but
    ``other``, which is what the step's ``step_key`` holds beyond them."""
    phases = {phase: round(sum(float(metrics.get(k, 0.0)) for k in keys.get(phase, ())), 3) for phase in PHASES}
    phases["other"] = round(max(0.0, float(metrics[step_key]) - sum(phases.values())), 3)
    return phases


# --- the kuberl side ---------------------------------------------------------------------------------------------

KUBERL_PHASES: dict[str, tuple[str, ...]] = {  # verl's names: kuberl kept them
    "generation": ("timing_s/gen",),
    "reward": ("timing_s/reward",),
    "log_probs": ("timing_s/old_log_prob", "timing_s/ref", "timing_s/values"),
    "update": ("timing_s/update_actor", "timing_s/update_critic", "timing_s/adv"),
    "sync": ("timing_s/update_weights",),
    "idle": ("timing_s/gen_wait",),
}
"""kuberl's timing metrics by phase. One step off policy, ``timing_s/gen`` and ``timing_s/reward`` ran during the
previous step (``timing_s/overlap``) and are not part of the step: they are left out there."""


KUBERL_SIDES: dict[str, dict[str, Any]] = {
    "kuberl": {},
    "kuberl_overlap": {"overlap": "oneStepOffPolicy"},
    "kuberl_async_k1": {"overlap": "async", "maxStaleness": 1},
    "kuberl_async_k2": {"overlap": "async", "maxStaleness": 2},
    "kuberl_async_k2_partial": {"overlap": "async", "maxStaleness": 2, "partialRollouts": True},
}
"""kuberl's rows by side name: what each sets in ``rollout`` besides the synchronous job (an overlapped row also
runs its engine separate, with the rollout correction)."""


def batches_ahead(side: str) -> int:
    """How many batches ``side`` generates ahead of the step that trains: its rollout's staleness limit."""
    from kuberl.api.spec import Rollout

    return Rollout.model_validate({"placement": "separate", **KUBERL_SIDES[side]}).staleness_limit


OVERLAP_ROWS: dict[str, list[str]] = {
    "off": ["kuberl"],
    "on": ["kuberl_overlap"],
    "both": ["kuberl", "kuberl_overlap"],
    "async": ["kuberl_overlap", "kuberl_async_k1", "kuberl_async_k2", "kuberl_async_k2_partial"],
    "async-k2": ["kuberl_overlap", "kuberl_async_k2", "kuberl_async_k2_partial"],
    "all": list(KUBERL_SIDES),
}
"""``--overlap``: the kuberl sides it runs."""


def kuberl_spec(args: argparse.Namespace, folder: str, data: str, gpu: bool, side: str = "kuberl") -> dict[str, Any]:
    """The RLJob of the job as ``side`` of :data:`KUBERL_SIDES` runs it: an overlapped side (one-step-off or
    asynchronous) has a separate engine, the rollout correction and the engine's log-probs."""
    budget = token_budget(args.max_tokens)
    if budget is None:
        micro: dict[str, Any] = {"ppoMicroBatchSizePerGPU": args.micro_batch}
    elif budget == "auto":  # left out: the trainer takes the largest budget its memory plan fits on the card
        micro = {"dynamicBatchSize": {"enabled": True}}
    else:
        micro = {"dynamicBatchSize": {"enabled": True, "maxTokenLenPerGPU": budget}}
    doc: dict[str, Any] = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "grpo-bench"},
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
                **micro,
            },
            "rollout": (
                {
                    "engine": "vllm",
                    "placement": "colocated",
                    "gpuMemoryUtilization": args.gpu_memory_utilization,
                    "calculateLogProbs": True,
                    "enforceEager": False,
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
    if KUBERL_SIDES[side]:
        spec = doc["spec"]
        spec["rollout"].update(placement="separate", calculateLogProbs=True, **KUBERL_SIDES[side])
        spec["algorithm"]["rolloutCorrection"] = {"enabled": True}
        spec["cluster"]["rollout"] = {"nodes": 1, "gpusPerNode": 1, "cpu": "2", "memory": "8Gi"}
    return doc


def kuberl_steps(metrics_lines: list[dict[str, Any]], *, overlap: bool) -> list[dict[str, Any]]:
    """Per-step tokens, seconds and phases from kuberl's ``metrics.jsonl`` records; ``overlap``: generated beside
    the update (one step off, or asynchronously: its ``gen_wait`` is the trainer's wait for ready groups)."""
    keys = dict(KUBERL_PHASES)
    if overlap:
        keys = {**keys, "generation": (), "reward": ()}
    return [
        {**step_record(m, keys, "rollout/staleness"), "overlap_s": m.get("timing_s/overlap")}
        for m in metrics_lines
        if "perf/total_num_tokens" in m
    ]


def step_record(metrics: dict[str, Any], phases: dict[str, tuple[str, ...]], staleness: str) -> dict[str, Any]:
    """One step's tokens, seconds, reward and phases from its metrics (verl's names, which kuberl's are)."""
    return {
        "step": int(metrics["step"]),
        "tokens": int(metrics["perf/total_num_tokens"]),
        "seconds": round(metrics["timing_s/step"], 3),
        "tokens_per_s": round(metrics["perf/total_num_tokens"] / metrics["timing_s/step"], 1),
        "response_length_mean": metrics.get("response_length/mean"),
        "reward_mean": metrics.get("critic/score/mean"),
        "staleness": metrics.get(staleness),
        "breakdown_s": phase_breakdown(metrics, phases, "timing_s/step"),
        # PyTorch's peaks in the trainer (GiB): a plan's miss split between allocations and the allocator's reserve
        "trainer_gib": {
            **{what: metrics.get(f"perf/max_memory_{what}_gb") for what in ("allocated", "reserved")},
            "engine_pool": metrics.get("perf/engine_pool_gb"),  # a colocated engine's, inside the two above
            # of reserved: free pieces of segments that also held live blocks (the allocator's fragmentation)
            "inactive_split": metrics.get("perf/max_inactive_split_gb"),
        },
        # > 0: the trainer's allocator filled the card and freed its cache, so the card's peak is not the side's need
        "alloc_retries": metrics.get("perf/alloc_retries"),
    }


def kuberl_plan(spec_doc: dict[str, Any], card: str | None) -> dict[str, Any] | None:
    """``kuberl plan`` of the side's RLJob on ``card`` (one GPU: the shared layout when separate), for the record
    beside the measured peak; None off a GPU or on a card the plan does not know."""
    if card is None:
        return None
    from kuberl.api.batching import plan_batches
    from kuberl.api.memory import gpu_named, plan_memory
    from kuberl.api.validation import parse_spec
    from kuberl.trainer.model.shape import model_shape
    from kuberl.trainer.plan.layout import ClusterFacts, plan_rollout_layout

    spec = parse_spec(spec_doc["spec"])
    try:
        gpu = gpu_named(card)
    except ValueError as exc:
        return {"error": str(exc)}
    layout = plan_rollout_layout(spec, plan_batches(spec), ClusterFacts(gpus=1)).kind
    plan = plan_memory(spec, model_shape(spec.model.path), gpu, layout=layout)
    return {
        "gpu": plan.gpu,
        "layout": plan.layout,
        "peak_gib": round(plan.peak_gib, 2),
        "phases_gib": {k: round(v, 2) for k, v in plan.phases_gib.items()},
        "fits": plan.fits,
        "token_budget": plan.token_budget,
    }


def run_kuberl(
    args: argparse.Namespace, folder: str, data: str, work: Path, gpu: bool, card: str | None, side: str = "kuberl"
) -> dict[str, Any]:
    import yaml

    name = side.replace("_", "-")
    overlap = bool(KUBERL_SIDES[side])
    run_dir = work / f"{name}-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl is appended to
    spec = kuberl_spec(args, folder, data, gpu, side)
    spec_path = work / f"{name}-rljob.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "kuberl.cli", "run", str(spec_path), "--run-dir", str(run_dir), "--no-progress"]
    env = {**os.environ, **OFFLINE_ENV}
    result: dict[str, Any] = {
        "engine": spec["spec"]["rollout"]["engine"],
        "placement": spec["spec"]["rollout"].get("placement", "colocated"),
        "overlap": spec["spec"]["rollout"].get("overlap", "none"),
        "max_staleness": spec["spec"]["rollout"].get("maxStaleness"),
        "spec_file": str(spec_path),
        "spec": spec["spec"],
        "plan": kuberl_plan(spec, card),
        **run_side(cmd, work, name, env, args.timeout),
    }
    shutil.rmtree(ROOT / CHECKPOINTS, ignore_errors=True)
    metrics_path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    result["steps"] = kuberl_steps(lines, overlap=overlap)
    return measured(result, args.steps, ahead=batches_ahead(side))


def print_side(name: str, result: dict[str, Any], out: str) -> None:
    error = result.get("error")
    lines = error.splitlines() if error else []
    summary = f"{lines[0]} … {lines[-1]} (more in {out})" if error else f"{result['tokens_per_s']:.0f} tokens/s"
    peak = result.get("nvml", {}).get("device_peak_gib")
    plan = (result.get("plan") or {}).get("peak_gib")
    memory = f"; card peak {peak:.1f} GiB (NVML)" if peak is not None else ""
    memory += f", plan {plan:.1f} GiB" if plan is not None else ""
    print(f"{name}: {summary} ({result['wall_s']} s{memory})", flush=True)


@dataclass(frozen=True)
class Earlier:
    """A result of the same benchmark, model and card that this run completes (``--merge-with``), read before this
    run writes anything: ``--out`` may name the same file."""

    path: str
    doc: dict[str, Any]


def read_earlier(path: str | None, result: dict[str, Any]) -> Earlier | None:
    """``path``'s result, checked against this run's header before any side runs."""
    if not path:
        return None
    doc = json.loads(Path(path).read_text())
    for key in ("benchmark", "model", "device"):
        if doc.get(key) != result.get(key):
            raise SystemExit(f"--merge-with {path}: its {key} is {doc.get(key)!r}, not {result.get(key)!r}")
    return Earlier(path, doc)


def merge_sides(result: dict[str, Any], earlier: Earlier | None, sides: tuple[str, ...]) -> dict[str, Any]:
    """A copy of ``result`` with the sides of ``earlier`` named by ``sides`` that ``result`` lacks (this run's result
    stays as it ran: it is merged again after every side)."""
    whole = dict(result)
    if earlier is None:
        return whole
    kept = [side for side in sides if side in earlier.doc and side not in result]
    whole.update({side: earlier.doc[side] for side in kept})
    whole["merged"] = {
        "from": earlier.path,
        "date": earlier.doc.get("date"),
        "command": earlier.doc.get("command"),
        "sides": kept,
    }
    return whole


def print_ratios(result: dict[str, Any], sides: tuple[str, ...], baseline: str, label: str) -> None:
    """Each of ``sides`` that ran against ``baseline``'s tokens/s of the same result (``ratio_<side>_vs_<label>``)."""
    theirs = result.get(baseline, {}).get("tokens_per_s")
    for side in sides:
        ours = result.get(side, {}).get("tokens_per_s")
        if ours and theirs:
            result[f"ratio_{side}_vs_{label}"] = round(ours / theirs, 3)
            print(f"{side} ÷ {baseline} tokens/s: {ours / theirs:.2f} ({ours:.0f} ÷ {theirs:.0f})")


def write_result(result: dict[str, Any], out: str) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(path)  # a run killed while writing leaves the last whole file
    print(f"wrote {path}")
