"""Benchmark: end-to-end GRPO tokens/s of ``kuberl run`` ÷ verl's own trainer, the same job on the same card.

The job, the data, the kuberl side and the summary are ``bench/grpo_bench.py``'s (its docstring says what is shared
and how tokens/s are counted). verl runs through its own entry point, ``python -m verl.trainer.main_ppo`` with the
Hydra overrides :func:`verl_overrides` writes from the kuberl side's RLJob, in its own process with
``PYTHONPATH=--verl-site:--vllm-site`` (verl 0.9.1 and what it imports, then the shared vLLM/Ray site; no kuberl):

- the settings both sides share are the RLJob's, through kuberl's own verl mapping (``kuberl.api.verl.to_verl``,
  the table ``kuberl import-verl`` reads), for the verl keys in :data:`SHARED`; the micro-batch token budget is the
  one kuberl uses (its memory plan's choice on this card when ``--max-tokens auto``), unless ``--verl-max-tokens``;
- what verl needs on this stack (:data:`VERL_STACK`): no flash-attn wheel exists for torch 2.11 + CUDA 13 offline,
  so ``attn_implementation`` is ``--verl-attention`` (sdpa) and ``use_remove_padding`` off (verl's packed path
  without flash-attn's varlen kernel makes transformers build a dense mask over the whole pack); its data file is the
  same rows with ``data_source`` ``openai/gsm8k``, which verl scores with its own strict GSM8K rule, the rule
  kuberl's builtin ``gsm8k`` reward copies;
- verl's fused linear + log-prob forward (``model.use_fused_kernels``, ``--verl-fused-kernels``, default ``torch``):
  without flash-attn's cross-entropy kernel, verl's log-probs from the logits
  (``verl.utils.torch_functional.logprobs_from_logits``) loop over the rows of a tensor that the padded path hands
  over as one row per token, which took 9.3 s of a 135M model's update on an H100 (1.9 s fused,
  bench/results/grpo_vs_verl_smollm2_h100*.json); the ``triton`` backend needs a hidden size divisible by 128
  (SmolLM2-135M's is 576), ``off`` is what the first rows ran;
- verl's best settings here: dynamic batch size (the token budget), its torch.compile of the log-prob math,
  ``algorithm.rollout_correction.bypass_mode`` (``--verl-bypass on``: the rollout's log-probs stand for the old
  ones, so there is no old-log-prob pass, as kuberl skips it), the synchronous v1 trainer
  (``trainer.v1.trainer_mode=sync``) and, for the overlapped row, ``colocate_async`` (generation carries on across
  steps with partial rollouts): verl's one-step-off-policy and fully-async recipes need GPUs of their own for the
  rollout, which one card has not.

Per step, verl's own metrics (its ``file`` logger, the console lines as fallback) give tokens (``perf/total_num_tokens``:
prompt + response tokens, as kuberl counts), seconds (``timing_s/step``) and the same phases as kuberl's breakdown
(:data:`VERL_PHASES`). Usage (GPU machine; ``tests/gpu/device_run.sh install install-verl bench-verl``)::

    python bench/grpo_vs_verl.py --model smollm2 --steps 5 --overlap both --out bench/results/grpo_vs_verl.json

``--overlap async --steps 6`` (or more) runs the overlapped pair and kuberl's asynchronous rows at ``maxStaleness`` 1
and 2, each printed against verl's overlapped row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.grpo_bench import (
    KUBERL_PHASES,
    OFFLINE_ENV,
    add_job_arguments,
    batches_ahead,
    check_steps,
    end_if_stopped,
    fewest_steps,
    gpu_name,
    job_settings,
    kuberl_plan,
    kuberl_spec,
    measured,
    merge_sides,
    model_folder_of,
    print_ratios,
    print_side,
    read_earlier,
    result_header,
    run_kuberl,
    run_side,
    step_record,
    stop_on_sigterm,
    write_data,
    write_result,
)

BENCHMARK = "end-to-end GRPO tokens/s, kuberl run ÷ verl main_ppo"
PACKAGES = ("torch", "transformers", "vllm", "ray", "kuberl")
VERL_PACKAGES = (
    "verl",
    "torch",
    "transformers",
    "vllm",
    "ray",
    "tensordict",
    "transferqueue",
    "hydra-core",
    "omegaconf",
)
VERL_SOURCE = "openai/gsm8k"
"""The data_source verl's default reward scores with its strict GSM8K rule."""
ARR = "actor_rollout_ref"
SHARED = (
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.filter_overlong_prompts",
    "data.shuffle",
    "data.seed",
    f"{ARR}.model.path",
    f"{ARR}.model.enable_gradient_checkpointing",
    f"{ARR}.actor.optim.lr",
    f"{ARR}.actor.optim.weight_decay",
    f"{ARR}.actor.optim.lr_warmup_steps",
    f"{ARR}.actor.optim.min_lr_ratio",
    f"{ARR}.actor.grad_clip",
    f"{ARR}.actor.ppo_mini_batch_size",
    f"{ARR}.actor.ppo_epochs",
    f"{ARR}.actor.use_dynamic_bsz",
    f"{ARR}.actor.use_kl_loss",
    f"{ARR}.actor.clip_ratio_low",
    f"{ARR}.actor.clip_ratio_high",
    f"{ARR}.actor.clip_ratio_c",
    f"{ARR}.actor.policy_loss.loss_mode",
    f"{ARR}.actor.loss_agg_mode",
    f"{ARR}.actor.entropy_coeff",
    f"{ARR}.actor.fsdp_config.param_offload",
    f"{ARR}.actor.fsdp_config.optimizer_offload",
    f"{ARR}.actor.fsdp_config.reshard_after_forward",
    f"{ARR}.rollout.n",
    f"{ARR}.rollout.name",
    f"{ARR}.rollout.tensor_model_parallel_size",
    f"{ARR}.rollout.gpu_memory_utilization",
    f"{ARR}.rollout.temperature",
    f"{ARR}.rollout.top_p",
    f"{ARR}.rollout.top_k",
    f"{ARR}.rollout.max_num_batched_tokens",
    f"{ARR}.rollout.max_num_seqs",
    f"{ARR}.rollout.enforce_eager",
    f"{ARR}.rollout.calculate_log_probs",
    "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.use_kl_in_reward",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.total_training_steps",
)
"""The verl keys whose values come from the RLJob (kuberl.api.verl's table); every one exists in verl 0.9.1."""
ASYNC_SIDES = ("kuberl_async_k1", "kuberl_async_k2")
"""With ``--overlap async``: kuberl's asynchronous rows (``maxStaleness`` 1 and 2), each against verl's overlapped
row, its best on one card."""
SIDES = ("kuberl", "verl", "kuberl_overlap", "verl_overlap", *ASYNC_SIDES)
VERL_ROWS = {"off": [False], "on": [True], "both": [False, True], "async": [True]}
"""``--overlap``: the rows it runs, overlapped or not (``async``: the overlapped pair and :data:`ASYNC_SIDES`;
verl's own fully-async trainer needs rollout GPUs of its own and is not compared here)."""
VERL_MODES = {False: "sync", True: "colocate_async"}
"""trainer.v1.trainer_mode of the synchronous and the overlapped row."""
VERL_CYCLES = {False: 1, True: 2}
"""Steps in the pattern each row's step times repeat (grpo_bench.summarise measures whole cycles): verl's
``colocate_async`` alternates a step that waits for its generation with one that does not (Qwen2-0.5B on an H200:
15.98 s, then 3.50; SmolLM2 on an H100: the same), so a window of one step measured either half (the 4-step rows:
4.60x on the dear step, 1.00x on the cheap one)."""
VERL_PHASES = {phase: keys for phase, keys in KUBERL_PHASES.items() if phase != "idle"}
"""verl's timing metrics (verl/trainer/ppo/v1/trainer_base.py's marked_timer names, which kuberl's are) by
grpo_bench.PHASES; verl has no idle wait of its own. In colocate_async ``gen`` is the wait for the replay buffer to
hold a batch: the generation the step could not hide."""


def verl_stack(
    *,
    data_file: str,
    work: Path,
    side: str,
    token_budget: int,
    attention: str,
    remove_padding: bool,
    bypass: bool,
    compile_log_probs: bool,
    fused_kernels: str,
) -> dict[str, Any]:
    """What verl needs to run the job here, beside the shared settings (the module's docstring says why)."""
    return {
        "data.train_files": [data_file],
        "data.val_files": [data_file],
        "data.truncation": "error",
        f"{ARR}.model.use_remove_padding": remove_padding,
        f"+{ARR}.model.override_config.attn_implementation": attention,
        f"{ARR}.actor.ppo_max_token_len_per_gpu": token_budget,
        f"{ARR}.actor.use_torch_compile": compile_log_probs,
        f"{ARR}.model.use_fused_kernels": fused_kernels != "off",
        **({f"{ARR}.model.fused_kernel_options.impl_backend": fused_kernels} if fused_kernels != "off" else {}),
        f"{ARR}.rollout.free_cache_engine": True,
        "algorithm.rollout_correction.bypass_mode": bypass,
        "trainer.logger": ["console", "file"],
        "trainer.project_name": "grpo-vs-verl",
        "trainer.experiment_name": side,
        "trainer.total_epochs": 1000,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
        "trainer.default_local_dir": str(work / f"{side}-checkpoints"),
        "trainer.device": "cuda",
        "trainer.use_v1": True,
        "hydra.run.dir": str(work / f"{side}-hydra"),
    }


def verl_overrides(kuberl_doc: dict[str, Any], stack: dict[str, Any], *, overlap: bool) -> dict[str, Any]:
    """verl's settings of the kuberl side's RLJob: :data:`SHARED` from kuberl's verl mapping, then ``stack``
    (:func:`verl_stack`) and the trainer mode."""
    from kuberl.api.validation import parse_spec, spec_to_wire
    from kuberl.api.verl import to_verl

    mapped = to_verl(spec_to_wire(parse_spec(kuberl_doc["spec"])))
    missing = [key for key in SHARED if key not in mapped]
    if missing:
        raise ValueError(f"kuberl.api.verl maps none of {missing}: the sides would not share these settings")
    return {**{key: mapped[key] for key in SHARED}, **stack, "trainer.v1.trainer_mode": VERL_MODES[overlap]}


def hydra_value(value: Any) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    return f"'{text}'" if re.search(r"[\s,=\[\]{}:'\"]", text) and not text.startswith("/") else text


def override_arguments(overrides: dict[str, Any]) -> list[str]:
    return [f"{key}={hydra_value(value)}" for key, value in overrides.items()]


def verl_data(rows_file: str, path: Path) -> str:
    """The benchmark's rows with data_source :data:`VERL_SOURCE` (verl's reward picks its rule by it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(rows_file)
    column = table.schema.get_field_index("data_source")
    table = table.set_column(column, "data_source", pa.array([VERL_SOURCE] * table.num_rows))
    pq.write_table(table, path)
    return str(path)


# --- verl's metrics ----------------------------------------------------------------------------------------------

_CONSOLE = re.compile(r"^(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\) )?step:(\d+) - (.*)$")
_NUMBER = re.compile(r"^(?:np\.\w+\()?([-+\w.]+)\)?$")
"""A number as pprint writes it: ``3.2``, or numpy's ``np.float64(3.2)``."""


def console_records(text: str) -> list[dict[str, Any]]:
    """verl's console logger lines (``step:N - key:value - key:value``, numbers only, a Ray actor's prefix before)
    as records."""
    records = []
    for line in text.splitlines():
        match = _CONSOLE.match(line.strip())
        if not match:
            continue
        record: dict[str, Any] = {"step": int(match.group(1))}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            number = _NUMBER.match(value)
            try:
                record[key] = float(number.group(1)) if number else float(value)
            except ValueError:
                continue
        records.append(record)
    return records


def file_records(path: Path) -> list[dict[str, Any]]:
    """verl's ``file`` logger (``{"step": N, "data": {...}}`` per line) as records."""
    if not path.exists():
        return []
    return [{"step": line["step"], **line["data"]} for line in map(json.loads, path.read_text().splitlines())]


def verl_steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-step tokens, seconds and phases, as the kuberl side reports them."""
    return [
        step_record(m, VERL_PHASES, "training/off_policy/trajectory_staleness/mean")
        for m in records
        if "perf/total_num_tokens" in m and "timing_s/step" in m
    ]


# --- the verl side -----------------------------------------------------------------------------------------------


def verl_env(sites: list[str], metrics_file: Path) -> dict[str, str]:
    """verl's process environment: its site and vLLM's first, nothing of kuberl, vLLM's engine in its own process."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    return {
        **env,
        **OFFLINE_ENV,
        "PYTHONPATH": ":".join(sites),
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "VERL_FILE_LOGGER_PATH": str(metrics_file),
    }


def verl_versions(env: dict[str, str]) -> dict[str, str | None]:
    """The packages verl's process imports, read in its own environment."""
    script = (
        "import json, importlib.metadata as m\n"
        "def v(p):\n    try: return m.version(p)\n    except Exception: return None\n"
        f"print(json.dumps({{p: v(p) for p in {list(VERL_PACKAGES)!r}}}))"
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    return dict(json.loads(out.stdout)) if out.returncode == 0 else {"error": out.stderr[-500:]}


CHECK_SCRIPT = """
import json, sys
from pathlib import Path
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config
overrides = [o for o in json.loads(sys.argv[1]) if not o.startswith("hydra.")]
with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
    config = compose(config_name="ppo_trainer", overrides=overrides)
OmegaConf.resolve(config)
validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
for path in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm"):
    omega_conf_to_dataclass(OmegaConf.select(config, path))
print("verl accepts the overrides:", config.trainer.v1.trainer_mode)
"""
"""Compose verl's Hydra config with the overrides and run its own checks, without Ray or a GPU (seconds)."""


def check_verl_config(overrides: dict[str, Any], env: dict[str, str]) -> str | None:
    """None when verl composes and validates ``overrides``; else the tail of its error."""
    args = json.dumps(override_arguments(overrides))
    out = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, args], env=env, capture_output=True, text=True)
    return None if out.returncode == 0 else "\n".join(out.stderr.splitlines()[-15:])


def run_verl(
    args: argparse.Namespace, kuberl_doc: dict[str, Any], data_file: str, work: Path, token_budget: int, overlap: bool
) -> dict[str, Any]:
    side = "verl-overlap" if overlap else "verl"
    metrics_file = work / f"{side}-metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    shutil.rmtree(work / f"{side}-checkpoints", ignore_errors=True)
    stack = verl_stack(
        data_file=data_file,
        work=work,
        side=side,
        token_budget=args.verl_max_tokens or token_budget,
        attention=args.verl_attention,
        remove_padding=args.verl_remove_padding == "on",
        bypass=args.verl_bypass == "on",
        compile_log_probs=args.verl_compile == "on",
        fused_kernels=args.verl_fused_kernels,
    )
    overrides = verl_overrides(kuberl_doc, stack, overlap=overlap)
    env = verl_env([*args.verl_site.split(":"), args.vllm_site], metrics_file)
    result: dict[str, Any] = {
        "trainer_mode": overrides["trainer.v1.trainer_mode"],
        "overrides": overrides,
        "versions": verl_versions(env),
    }
    refused = check_verl_config(overrides, env)
    if refused is not None:
        return {**result, "error": f"verl refuses the configuration:\n{refused}", "steps": [], "wall_s": 0.0}
    if args.verl_check_only:
        return {**result, "checked": True, "steps": [], "wall_s": 0.0}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *override_arguments(overrides)]
    result.update(run_side(cmd, work, side, env, args.timeout, cwd=work))
    records = file_records(metrics_file) or console_records(Path(result["stdout_log"]).read_text(errors="replace"))
    result["metrics_source"] = "file" if metrics_file.exists() else "console"
    result["steps"] = verl_steps(records)
    # verl's overlapped row (colocate_async) generates one batch ahead, as kuberl's one-step-off row
    ahead = batches_ahead("kuberl_overlap" if overlap else "kuberl")
    return measured(result, args.steps, ahead=ahead, cycle=VERL_CYCLES[overlap])


# --- driver ------------------------------------------------------------------------------------------------------


def kuberl_budget(args: argparse.Namespace, doc: dict[str, Any], card: str | None) -> int:
    """The token budget kuberl's side uses: the RLJob's, or its memory plan's choice on ``card``."""
    from kuberl.api.memory import CPU_TOKEN_BUDGET

    given = doc["spec"]["batch"].get("dynamicBatchSize", {}).get("maxTokenLenPerGPU")
    if given:
        return int(given)
    plan = kuberl_plan(doc, card) or {}
    return int(plan.get("token_budget") or CPU_TOKEN_BUDGET)


def print_async_ratios(result: dict[str, Any]) -> None:
    """Each asynchronous kuberl row against verl's overlapped row of the same run (``ratio_<side>_vs_verl_overlap``)."""
    print_ratios(result, ASYNC_SIDES, "verl_overlap", "verl_overlap")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_job_arguments(parser)
    parser.add_argument("--only", choices=["kuberl", "verl"], help="run one system (no ratio)")
    parser.add_argument(
        "--verl-site",
        default=os.environ.get("VERL_SITE", "/root/verl-site"),
        help="verl's site folder(s), colon-separated (tests/gpu/device_run.sh install-verl)",
    )
    parser.add_argument("--vllm-site", default=os.environ.get("VLLM_SITE", "/root/site"), help="vLLM and Ray")
    parser.add_argument("--verl-attention", default="sdpa", help="attn_implementation (no flash-attn wheel here)")
    parser.add_argument("--verl-remove-padding", choices=["on", "off"], default="off")
    parser.add_argument("--verl-bypass", choices=["on", "off"], default="on", help="rollout log-probs as the old ones")
    parser.add_argument("--verl-compile", choices=["on", "off"], default="on", help="verl's torch.compile of log-probs")
    parser.add_argument(
        "--verl-fused-kernels",
        choices=["off", "torch", "triton"],
        default="torch",
        help="verl's fused linear + log-prob kernels (model.use_fused_kernels, its impl_backend; triton needs a "
        "hidden size divisible by 128)",
    )
    parser.add_argument("--verl-max-tokens", type=int, help="verl's ppo_max_token_len_per_gpu (default: kuberl's)")
    parser.add_argument(
        "--verl-check-only",
        action="store_true",
        help="compose and validate verl's configuration of each row in verl's environment, run nothing (seconds)",
    )
    parser.add_argument("--out", default="bench/results/grpo_vs_verl.json")
    args = parser.parse_args()
    check_steps(parser, args)
    stop_on_sigterm()
    if args.max_tokens == "0":
        parser.error("--max-tokens 0: verl's side is compared at its token budget; give one, or auto")
    if args.overlap not in VERL_ROWS:
        parser.error(f"--overlap {args.overlap}: this benchmark has the rows {', '.join(VERL_ROWS)}")
    fewest = fewest_steps(batches_ahead("kuberl_overlap"), VERL_CYCLES[True])
    if args.only != "kuberl" and True in VERL_ROWS[args.overlap] and args.steps < fewest:
        parser.error(
            f"--steps must be at least {fewest} for verl's overlapped row: step 1 is warm-up, steps 2 and N take and "
            f"generate no batch ahead, and its steps alternate, so it is measured over whole cycles of "
            f"{VERL_CYCLES[True]} (VERL_CYCLES)"
        )

    import torch

    gpu = torch.cuda.is_available()
    if not gpu and args.only != "kuberl" and not args.verl_check_only:
        parser.error("verl's vLLM rollout needs a GPU; on CPU run --only kuberl")
    card = gpu_name() if gpu else None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="grpo-vs-verl-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    folder = model_folder_of(args.model, work)
    data = write_data(folder, work / "train.parquet", args.prompts * (args.steps + 1), args.max_prompt, args.seed)
    verl_file = verl_data(data["file"], work / "train-verl.parquet")
    print(
        f"model {args.model} → {folder}, {data['rows']} prompts, in {time.perf_counter() - start:.1f} s; logs in {work}"
    )
    settings = job_settings(args, gpu, data)
    result = result_header(BENCHMARK, args, card=card, folder=folder, work=work, settings=settings, packages=PACKAGES)
    earlier = read_earlier(args.merge_with, result)

    def side_done(side: str) -> None:
        """A run stopped later keeps the sides that finished; one stopped during ``side`` ends here."""
        write_result(merge_sides(result, earlier, SIDES), args.out)
        end_if_stopped(result[side])

    for overlap in VERL_ROWS[args.overlap]:
        suffix = "_overlap" if overlap else ""
        doc = kuberl_spec(args, folder, data["file"], gpu, f"kuberl{suffix}")
        if args.only != "verl" and not args.verl_check_only:
            print(f"running kuberl{suffix} ...", flush=True)
            result[f"kuberl{suffix}"] = run_kuberl(args, folder, data["file"], work, gpu, card, f"kuberl{suffix}")
            print_side(f"kuberl{suffix}", result[f"kuberl{suffix}"], args.out)
            side_done(f"kuberl{suffix}")
        if args.only != "kuberl":
            print(f"running verl{suffix} ...", flush=True)
            budget = kuberl_budget(args, doc, card)
            result[f"verl{suffix}"] = run_verl(args, doc, verl_file, work, budget, overlap)
            if result[f"verl{suffix}"].get("checked"):
                print(f"verl{suffix}: verl accepts the configuration ({result[f'verl{suffix}']['trainer_mode']})")
            else:
                print_side(f"verl{suffix}", result[f"verl{suffix}"], args.out)
                side_done(f"verl{suffix}")
    if args.overlap == "async" and args.only != "verl" and not args.verl_check_only:
        for side in ASYNC_SIDES:
            print(f"running {side} ...", flush=True)
            result[side] = run_kuberl(args, folder, data["file"], work, gpu, card, side)
            print_side(side, result[side], args.out)
            side_done(side)
    result = merge_sides(result, earlier, SIDES)
    print_async_ratios(result)
    for suffix in ("", "_overlap"):
        ours, theirs = (result.get(f"{s}{suffix}", {}).get("tokens_per_s") for s in ("kuberl", "verl"))
        if ours and theirs:
            result[f"ratio{suffix}"] = round(ours / theirs, 3)
            print(f"kuberl{suffix} ÷ verl{suffix} tokens/s: {ours / theirs:.2f} ({ours:.0f} ÷ {theirs:.0f})")
    sides = [side for side in SIDES if side in result]
    for side in sides:
        phases = result[side].get("phases_s")
        if phases:
            print(f"{side} seconds per step: " + " ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    write_result(result, args.out)
    return 0 if all("error" not in result[side] for side in sides) else 1


if __name__ == "__main__":
    sys.exit(main())
