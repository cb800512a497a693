"""Benchmark (d): actor-update MFU, the trainer's own PPO/GRPO update (``ActorWorker.update``) on one device, swept over
micro-batch size, gradient checkpointing, ``model.compile`` and ``actor.fsdp.reshardAfterForward``.

Per model, checkpointing and compile setting the actor is built by ``ActorWorker.build_policy``, as the trainer builds it: an
fp32 model (the shapes of bench/shapes.py drawn on the device) → ``fsdp.prepare`` (FSDP2, the spec's bf16 mixed
precision, fp32 masters) → ``fsdp.make_optimizer`` → ``fsdp.make_scheduler``, in one process with a single-rank
``torch.distributed`` group (nccl on cuda, gloo on cpu, as ``DistributedWorker.init_distributed``). One iteration =
one optimizer step of the trainer's update over a mini-batch of ``--mini-batch`` responses of ``--prompt-len`` +
``--response-len`` tokens (no padding) in micro-batches of ``--micro-batch`` rows: forward of prompt + response,
response log-probs, ``losses.policy_loss`` (random GRPO-style advantages, old log-probs = the current policy's, from
``compute_log_probs``), backward, grad clip, AdamW step. ``--warmup`` iterations, then ``--iters`` timed between
``torch.cuda.synchronize()`` calls; medians reported.

FLOPs are counted as the trainer counts them for ``perf/mfu/actor`` (run.py): ``model_family_flops_per_token(config)``
per prompt + response token, i.e. 6·N with N the matmul parameters (projections of every layer + the output head),
no attention term (the trainer passes no sequence length). MFU = FLOPs ÷ seconds ÷ ``--peak-tflops``. Not counted, by
the MFU convention: the recompute of gradient checkpointing. ``mfu_attn`` adds the attention term 12·L·H·S of the same
function at S = prompt + response.

    python bench/actor_mfu.py --out bench/results/actor_mfu.json --trainer-mfu 0.04        # one H200, ~1 min
    python bench/actor_mfu.py --device cpu --models tiny --prompt-len 16 --response-len 16 --micro-batch 2 4 \\
        --mini-batch 4 --warmup 1 --iters 2 --out /tmp/actor_mfu.json                     # CPU smoke check
    python bench/actor_mfu.py --models qwen2-0.5b --micro-batch 64 --grad-ckpt off --profile 25  # where it goes
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shapes import RANDOM, random_causal_lm

TINY = "tiny://llama?hidden=64&layers=2&heads=4&kv_heads=2&seed=0"
"""``--models tiny``: the trainer's tiny test model (CPU smoke checks)."""
LAUNCHES = {"cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"}
"""The CUDA runtime and driver calls that launch a kernel, as torch.profiler names them."""
H200_PEAK_TFLOPS = 989.4
PEAK_SOURCE = (
    "NVIDIA H200 SXM datasheet: BF16 Tensor Core 1,979 TFLOP/s with 2:4 sparsity, i.e. 989.4 dense "
    "(the trainer's run.PEAK_FLOPS uses 989e12 for H200)"
)
FLOPS_COUNTED = (
    "run.py's perf/mfu/actor convention: models.model_family_flops_per_token(config) = 6·N per prompt + "
    "response token, N = matmul parameters (q/k/v/o and MLP projections of every layer + the output head, "
    "a tied embedding counted once), no attention term; mfu_attn adds 12·L·H·S at S = prompt + response. "
    "Not counted: gradient-checkpointing recompute (MFU convention), the old-log-prob forward (outside "
    "the timed update), the optimizer and clip (O(N) per step). The output head is counted for every "
    "token although the actor computes logits for the response only (logits_to_keep), so MFU slightly "
    "overstates the work done (see head_share_counted_not_run)."
)


def build_model(name: str, device):
    """The fp32 model ``fsdp.prepare`` receives in ``ActorWorker.init_model``: ``load_trainer_model``'s (on the CPU)
    for ``tiny`` and model paths; random shapes are drawn on ``device`` (seconds faster for Qwen2-0.5B), where
    ``prepare`` would move them anyway, with the trainer's attention over packed rows."""
    from kuberl.trainer.model.attention import use_varlen_attention
    from kuberl.trainer.workers.base import load_trainer_model

    if name in RANDOM:
        model = random_causal_lm(name, device.type)
        use_varlen_attention(model)
        return model
    return load_trainer_model(TINY if name == "tiny" else name)


def job_spec(
    name: str,
    args: argparse.Namespace,
    *,
    micro_batch: int,
    gradient_checkpointing: bool,
    compile_layers: bool,
    reshard_after_forward: bool = True,
):
    """An RLJob spec with the benchmark's shapes; everything else (optimizer, clipping, loss aggregation, FSDP options,
    temperature) stays at the spec defaults the trainer would use."""
    from kuberl.api.spec import RLJobSpec

    return RLJobSpec.model_validate(
        {
            "model": {
                "path": name,
                "dtype": "bfloat16",
                "gradientCheckpointing": gradient_checkpointing,
                "compile": compile_layers,
            },
            "algorithm": {"advantageEstimator": "grpo"},
            "data": {
                "trainFiles": ["unused.parquet"],
                "maxPromptLength": args.prompt_len,
                "maxResponseLength": args.response_len,
            },
            "batch": {
                "trainBatchSize": args.mini_batch,
                "ppoMiniBatchSize": args.mini_batch,
                "ppoMicroBatchSizePerGPU": micro_batch,
            },
            "actor": {"fsdp": {"reshardAfterForward": reshard_after_forward}},
            "cluster": {"device": args.device, "trainer": {"nodes": 1, "gpusPerNode": 1}},  # one rank: this process
        }
    )


def random_rows(n: int, prompt_len: int, response_len: int, vocab: int):
    """A mini-batch in the trainer's row layout (microbatch.py), every token real; one advantage per response."""
    import torch

    g = torch.Generator().manual_seed(0)
    return {
        "prompts": torch.randint(0, vocab, (n, prompt_len), generator=g),
        "prompt_mask": torch.ones(n, prompt_len, dtype=torch.long),
        "responses": torch.randint(0, vocab, (n, response_len), generator=g),
        "response_mask": torch.ones(n, response_len, dtype=torch.long),
        "advantages": torch.randn(n, 1, generator=g).expand(n, response_len).contiguous(),
    }


def profile_update(worker, rows, totals, top: int) -> dict:
    """One more ``worker.update`` under torch.profiler: its wall time, the kernels it launched, on a GPU its
    :func:`device_timeline` (busy time, time by kind of kernel, where the GPU waited), and the ``top`` operators by
    their own device time (on a GPU) and by their own CPU time. A wall time far above the busy time means the update
    waits on Python and kernel launches; the kinds and the device's list say which work beyond the counted matmuls
    costs the most."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = worker.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        worker.update([rows], totals)
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()

    def ranked(attribute: str) -> list[dict]:
        ordered = sorted(events, key=lambda e: getattr(e, attribute), reverse=True)
        total = sum(getattr(e, attribute) for e in events) or 1.0
        return [
            {
                "op": e.key,
                "self_ms": round(getattr(e, attribute) / 1e3, 2),
                "share": round(getattr(e, attribute) / total, 4),
                "calls": e.count,
            }
            for e in ordered[:top]
        ]

    return {
        "wall_ms": round(wall * 1e3, 1),
        **({"timeline": device_timeline(device_kernels(prof))} if cuda else {}),
        "kernel_launches": sum(e.count for e in events if e.key in LAUNCHES),
        **({"device": ranked("self_device_time_total")} if cuda else {}),
        "host": ranked("self_cpu_time_total"),
    }


KERNEL_KINDS = (
    ("collective", ("nccl",)),
    ("attention", ("flash", "fmha")),
    ("optimizer", ("adam", "multi_tensor")),
    ("compiled", ("triton",)),
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "cublas")),
    ("copy", ("memcpy", "memset", "copy")),
    ("reduction", ("reduce",)),
    ("elementwise", ("elementwise",)),
)
"""Kinds of GPU work, each by substrings of its kernels' names (lower case), first match wins: a flash-attention
kernel's template arguments name cutlass types, a dtype cast runs as an ``elementwise_kernel`` of a
``direct_copy_kernel`` and counts as a copy, and inductor's fused kernels (``triton_*``) may carry ``copy`` in their
names."""


LONG_GAP_MS = 0.05
"""An idle gap this long is a wait on the host (a read-back, Python between launches); shorter ones are the few
microseconds between dependent kernels that the GPU pays even when its queue is full."""


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(mark in lowered for mark in marks)), "other")


def device_timeline(kernels: list[tuple[int, int, str]], top_gaps: int = 5) -> dict:
    """Where the GPU's time went in one update, from its kernels and copies as ``(start_ns, end_ns, name)``.

    ``busy_ms``: the union of their intervals; the wall time minus this is the time the device waited on the host.
    ``by_kind_ms``: each :data:`KERNEL_KINDS` kind's own time (overlapping kernels both count), with the names
    behind ``other``. ``idle_ms``: the gaps between the first kernel's start and the last one's end, those of at
    least :data:`LONG_GAP_MS` apart, and the ``top_gaps`` longest with the kernels on either side, so that a wait
    can be placed in the update.
    """
    spans = sorted(kernels)
    by_kind: dict[str, float] = {}
    other: dict[str, float] = {}
    gaps: list[dict] = []
    busy, covered_to, last_name = 0, spans[0][0] if spans else 0, ""
    for start, end, name in spans:
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + (end - start) / 1e6
        if kind == "other":
            other[name] = other.get(name, 0.0) + (end - start) / 1e6
        if start > covered_to:
            gaps.append(
                {
                    "ms": (start - covered_to) / 1e6,
                    "at_ms": (covered_to - spans[0][0]) / 1e6,
                    "after": last_name,
                    "before": name,
                }
            )
        busy += max(0, end - max(start, covered_to))
        if end > covered_to:
            covered_to, last_name = end, name
    longest = sorted(gaps, key=lambda gap: gap["ms"], reverse=True)[:top_gaps]
    return {
        "busy_ms": round(busy / 1e6, 2),
        "span_ms": round((covered_to - spans[0][0]) / 1e6, 2) if spans else 0.0,
        "idle_ms": round(sum(gap["ms"] for gap in gaps), 2),
        "idle_gaps": len(gaps),
        "idle_long_ms": round(sum(gap["ms"] for gap in gaps if gap["ms"] >= LONG_GAP_MS), 2),
        "idle_long_gaps": sum(gap["ms"] >= LONG_GAP_MS for gap in gaps),
        "by_kind_ms": {kind: round(ms, 2) for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "other_top": {name[:120]: round(ms, 2) for name, ms in sorted(other.items(), key=lambda kv: -kv[1])[:5]},
        "longest_gaps": [
            {
                **gap,
                "ms": round(gap["ms"], 3),
                "at_ms": round(gap["at_ms"], 2),
                "after": gap["after"][:80],
                "before": gap["before"][:80],
            }
            for gap in longest
        ],
    }


def device_kernels(prof) -> list[tuple[int, int, str]]:
    """Every kernel and copy the GPU ran under ``prof``, as ``(start_ns, end_ns, name)``."""
    from torch.autograd import DeviceType

    return [
        (e.start_ns(), e.end_ns(), e.name())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == DeviceType.CUDA
    ]


def measure(worker, rows, *, warmup: int, iters: int, profile_top: int = 0) -> dict:
    """Seconds of ``worker.update`` (one optimizer step over ``rows``) and the peak memory it allocated; with
    ``profile_top``, where one more update spends its time (:func:`profile_update`, after the timed iterations)."""
    import torch

    cuda = worker.device.type == "cuda"
    rows = {**rows, "old_log_probs": worker.compute_log_probs(rows)["log_probs"]}  # current policy, detached
    totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": float(rows["responses"].shape[0])}]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for i in range(warmup + iters):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        worker.update([rows], totals)
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            seconds.append(time.perf_counter() - start)
    result = {
        "iter_s": statistics.median(seconds),
        "iter_s_all": [round(s, 4) for s in seconds],
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }
    if profile_top:
        result["profile"] = profile_update(worker, rows, totals, profile_top)
    return result


def significant(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def free_actor(worker) -> None:
    import torch

    worker.model = worker.optimizer = worker.scheduler = None
    gc.collect()
    if worker.device.type == "cuda":
        torch.cuda.empty_cache()


def run_model(name: str, args: argparse.Namespace, worker) -> list[dict]:
    import torch

    from kuberl.trainer.model.loading import model_family_flops_per_token, num_params
    from kuberl.trainer.plan.execution import plan_execution

    peak = args.peak_tflops * 1e12
    seq = args.prompt_len + args.response_len
    results = []
    for checkpointing, compile_layers, reshard in itertools.product(args.grad_ckpt, args.compile, args.reshard):
        settings = {
            "gradient_checkpointing": checkpointing,
            "compile_layers": compile_layers,
            "reshard_after_forward": reshard,
        }
        worker.spec = job_spec(name, args, micro_batch=args.micro_batch[0], **settings)
        start = time.perf_counter()
        model = build_model(name, worker.device)
        config = model.config
        params = num_params(model)
        worker.build_policy(model, total_steps=(args.warmup + args.iters) * len(args.micro_batch))
        build_s = time.perf_counter() - start
        per_token = model_family_flops_per_token(config)  # what run.py uses for perf/mfu/actor
        per_token_attn = model_family_flops_per_token(config, seq)
        head = config.vocab_size * config.hidden_size
        # the head's FLOPs counted for prompt tokens, which the actor never runs through it (logits_to_keep = R + 1)
        head_share = 6.0 * head * (args.prompt_len - 1) / (per_token * seq)
        rows = random_rows(args.mini_batch, args.prompt_len, args.response_len, config.vocab_size)
        tokens = args.mini_batch * seq
        for micro in args.micro_batch:
            worker.spec = job_spec(name, args, micro_batch=micro, **settings)
            worker.plan = plan_execution(worker.spec)
            row = {
                "model": name,
                "params": params,
                "matmul_params": round(per_token / 6),
                "micro_batch": micro,
                "mini_batch": args.mini_batch,
                "grad_accum": -(-args.mini_batch // micro),
                "gradient_checkpointing": checkpointing,
                "compile": compile_layers,
                "reshard_after_forward": reshard,
                "tokens_per_iter": tokens,
                "build_s": round(build_s, 1),
                "head_share_counted_not_run": round(head_share, 4),
            }
            try:
                row.update(measure(worker, rows, warmup=args.warmup, iters=args.iters, profile_top=args.profile))
            except torch.OutOfMemoryError as error:  # larger micro-batches would not fit either
                row["error"] = f"out of memory: {str(error).splitlines()[0]}"
                results.append(row)
                print(json.dumps(row), flush=True)
                break
            s = row["iter_s"]
            row.update(
                {
                    "iter_s": round(s, 4),
                    "tokens_per_s": round(tokens / s, 1),
                    "tflops": significant(per_token * tokens / s / 1e12),
                    "mfu": significant(per_token * tokens / s / peak),
                    "tflops_attn": significant(per_token_attn * tokens / s / 1e12),
                    "mfu_attn": significant(per_token_attn * tokens / s / peak),
                }
            )
            results.append(row)
            print(json.dumps({key: value for key, value in row.items() if key != "profile"}), flush=True)
            if "profile" in row:
                print_profile(row["profile"])
        free_actor(worker)
    return results


def print_profile(profiled: dict) -> None:
    timeline = profiled.get("timeline")
    busy = f", device busy {timeline['busy_ms']} ms" if timeline else ""
    print(
        f"  profiled update: {profiled['wall_ms']} ms wall{busy}, {profiled['kernel_launches']} kernel launches",
        flush=True,
    )
    if timeline:
        kinds = ", ".join(f"{kind} {ms}" for kind, ms in timeline["by_kind_ms"].items())
        print(f"  device ms by kind: {kinds}", flush=True)
        print(
            f"  device idle between its first and last kernel: {timeline['idle_ms']} ms in {timeline['idle_gaps']} "
            f"gaps, {timeline['idle_long_ms']} ms in the {timeline['idle_long_gaps']} of ≥ {LONG_GAP_MS} ms; longest: "
            + "; ".join(f"{gap['ms']} ms at {gap['at_ms']} ms" for gap in timeline["longest_gaps"]),
            flush=True,
        )
    for side in ("device", "host") if "device" in profiled else ("host",):
        print(f"  costliest by own {side} time:", flush=True)
        for op in profiled[side]:
            print(f"    {op['self_ms']:9.2f} ms  {op['share']:6.1%}  ×{op['calls']:<6} {op['op'][:90]}", flush=True)


def print_table(runs: list[dict], args: argparse.Namespace, best: dict | None) -> None:
    columns = [
        "model",
        "micro",
        "accum",
        "ckpt",
        "compile",
        "reshard",
        "tokens/s",
        "TFLOP/s",
        "MFU",
        "MFU+attn",
        "peak GiB",
    ]
    columns += ["÷trainer"] if args.trainer_mfu else []
    rows = []
    for r in runs:
        row = [r["model"], str(r["micro_batch"]), str(r["grad_accum"])]
        row += ["on" if r[key] else "off" for key in ("gradient_checkpointing", "compile", "reshard_after_forward")]
        if "error" in r:
            rows.append([*row, r["error"][:70]])
            continue
        row += [
            f"{r['tokens_per_s']:,.0f}",
            f"{r['tflops']:.4g}",
            f"{r['mfu']:.3g}",
            f"{r['mfu_attn']:.3g}",
            "-" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}",
        ]
        rows.append(row + ([f"{r['mfu'] / args.trainer_mfu:.3g}×"] if args.trainer_mfu else []))
    full = [columns, *(row for row in rows if len(row) == len(columns))]
    widths = [max(len(row[i]) for row in full) for i in range(len(columns))]
    print()
    for row in [columns, *rows]:
        cells = [
            cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) if i < 6 or len(row) == len(columns) else cell
            for i, cell in enumerate(row)
        ]
        print("  ".join(cells))
    print(
        f"FLOPs: 6·N per prompt+response token, as run.py's perf/mfu/actor (no attention term; "
        f"gradient-checkpointing recompute not counted).\nMFU+attn adds 12·L·H·S at "
        f"S = {args.prompt_len + args.response_len}. "
        f"MFU = achieved ÷ peak {args.peak_tflops} TFLOP/s. Each row: one optimizer step over {args.mini_batch} "
        f"responses, median of {args.iters}."
    )
    if best and args.trainer_mfu:
        print(
            f"best MFU {best['mfu']:.3g} ({best['model']}, micro-batch {best['micro_batch']}, checkpointing "
            f"{'on' if best['gradient_checkpointing'] else 'off'}) = {best['mfu'] / args.trainer_mfu:.3g}× the "
            f"trainer's perf/mfu/actor {args.trainer_mfu}.\nThe trainer's figure divides real (unpadded) tokens by "
            f"the update_actor wall time, which also covers the padding its forward\ncomputes, the micro-batch "
            f"size of the run, and Ray dispatch plus the transfer of the rows; here every token is real."
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["smollm2-shape", "qwen2-0.5b"],
        help=f"random shapes {sorted(RANDOM)}, 'tiny' ({TINY}), or any model.path the trainer loads",
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--micro-batch", nargs="+", type=int, default=[8, 16, 32, 64], help="responses per micro-batch")
    parser.add_argument(
        "--mini-batch", type=int, default=None, help="responses per optimizer step (default: the largest micro-batch)"
    )
    parser.add_argument("--grad-ckpt", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--compile", nargs="+", choices=["off", "on"], default=["on"], help="model.compile")
    parser.add_argument(
        "--reshard",
        nargs="+",
        choices=["off", "on"],
        default=["on"],
        help="actor.fsdp.reshardAfterForward (off: one rank keeps the gathered bf16 parameters for the backward)",
    )
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=H200_PEAK_TFLOPS, help="dense bf16 peak of one device")
    parser.add_argument(
        "--trainer-mfu",
        type=float,
        default=None,
        help="perf/mfu/actor of a GRPO run (0.017-0.036 per step in bench/results/grpo_smollm2.json)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after timing, profile one update: wall time, kernel launches, on a GPU its busy time by kind of kernel and "
        "its idle gaps, its N costliest operators on each side",
    )
    parser.add_argument("--out", default="bench/results/actor_mfu.json")
    args = parser.parse_args()
    args.micro_batch = sorted(args.micro_batch)
    args.mini_batch = args.mini_batch or args.micro_batch[-1]
    args.grad_ckpt = [choice == "on" for choice in args.grad_ckpt]
    args.compile = [choice == "on" for choice in args.compile]
    args.reshard = [choice == "on" for choice in args.reshard]

    import torch
    import transformers

    from kuberl.trainer.model import fsdp
    from kuberl.trainer.plan.execution import plan_execution
    from kuberl.trainer.plan.layout import ClusterFacts
    from kuberl.trainer.rollout.weight_sync import free_port
    from kuberl.trainer.workers.actor import ActorWorker

    first = job_spec(
        args.models[0], args, micro_batch=args.micro_batch[0], gradient_checkpointing=False, compile_layers=False
    )
    facts = ClusterFacts(local_cpus=torch.get_num_threads())
    worker = ActorWorker(first, plan_execution(first, facts), 0)  # device, seeds
    worker.init_distributed("127.0.0.1", free_port())
    cuda = worker.device.type == "cuda"
    algo = first.algorithm
    device = torch.cuda.get_device_name(worker.device) if cuda else "cpu"
    results = {
        "benchmark": "actor-update MFU (bench/actor_mfu.py)",
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "peak_tflops": args.peak_tflops,
        "peak_source": PEAK_SOURCE if args.peak_tflops == H200_PEAK_TFLOPS else "--peak-tflops",
        "workload": {
            "prompt_len": args.prompt_len,
            "response_len": args.response_len,
            "mini_batch": args.mini_batch,
            "warmup": args.warmup,
            "iters": args.iters,
            "spec_dtype": first.model.dtype,
            "compute_dtype": str(fsdp.compute_dtype(first.model.dtype, worker.device.type)),
            "algorithm": f"{algo.advantage_estimator}: policy_loss, {algo.loss_agg_mode}, clip "
            f"{algo.clip_ratio_low}/{algo.clip_ratio_high}, dual clip {algo.clip_ratio_c}, "
            f"KL loss {algo.kl.loss.enabled}, entropy coef {algo.entropy_coef}",
            "timed": "ActorWorker.update([mini-batch]): micro-batch forwards/backwards, clip, AdamW step",
        },
        "flops_counted": FLOPS_COUNTED,
        "trainer_mfu": args.trainer_mfu,
        "runs": [],
    }
    print(
        f"{device}, torch {torch.__version__}, transformers {transformers.__version__}, peak {args.peak_tflops} "
        f"TFLOP/s; {args.mini_batch} × ({args.prompt_len} + {args.response_len}) tokens per optimizer step",
        flush=True,
    )
    try:
        for name in args.models:
            results["runs"].extend(run_model(name, args, worker))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    ok = [r for r in results["runs"] if "mfu" in r]
    best = max(ok, key=lambda r: r["mfu"], default=None)
    results["best"] = best and {
        k: best[k]
        for k in ("model", "micro_batch", "gradient_checkpointing", "compile", "reshard_after_forward", "mfu")
    }
    if best and args.trainer_mfu:
        results["best_mfu_over_trainer"] = significant(best["mfu"] / args.trainer_mfu, 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")

    print_table(results["runs"], args, best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
