"""Benchmark (c): colocated weight-sync seconds (FSDP2 shards → vLLM engine in the same process) against the floor
``bytes ÷ measured device-to-device copy bandwidth``.

For each model, in its own process (vLLM keeps process-wide state): an FSDP2 actor (torch.distributed, one rank,
bf16 mixed precision over fp32 masters, as the trainer builds it) and a VLLMRollout that joined its process group
(``external_launcher``), built with ``load_format=dummy``. One sync = what the trainer does after each update:

    engine asleep (level 2) → update_weights(full_named_parameters(actor))   # wakes weights, gathers, casts, loads
                            → wake()                                         # KV cache back

timed per phase, median of ``--repeats``, for each ``--bucket-mb`` through vLLM's loader (the baseline), then
through the direct copies recorded from the first load (``direct``, kuberl.trainer.rollout.direct_load), whose
result is checked to equal the loader's parameter for parameter (``direct_equals_loader``). The floor is one bf16
copy of the weights: ``2 × bytes / bandwidth`` where bandwidth counts bytes read plus written by a large ``copy_``. Correctness: the
engine's prompt log-probs of a fixed sequence after the sync are compared with the actor's forward.

    python bench/weight_sync.py --models smollm2 qwen2-0.5b --out bench/results/weight_sync.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shapes import RANDOM, random_causal_lm, random_config


def copy_bandwidth(gib: float = 2.0, repeats: int = 20) -> float:
    """Bytes read + written per second by a device-to-device ``copy_`` of ``gib`` GiB (median of ``repeats``)."""
    import torch

    n = int(gib * 2**30) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / statistics.median(times)


def model_source(name: str, workdir: Path) -> str:
    if name not in RANDOM:
        from kuberl.trainer.rollout.vllm import model_folder

        return model_folder(name)
    folder = workdir / f"{name}-random"
    random_config(name).save_pretrained(folder)
    return str(folder)


def measure_one(name: str, bucket_mbs: list[int], repeats: int) -> dict:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from kuberl.trainer.model import fsdp
    from kuberl.trainer.rollout.vllm import VLLMRollout, gpu_memory_in_use_gib
    from kuberl.trainer.rollout.weight_sync import free_port, is_tied

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    workdir = Path(tempfile.mkdtemp(prefix="kuberl-bench-"))
    folder = model_source(name, workdir)
    random_init = name in RANDOM
    if random_init:
        model = random_causal_lm(name, "cuda")
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tied = is_tied(model)
    params = sum(p.numel() for p in model.parameters())
    actor = fsdp.prepare(
        model,
        device=torch.device("cuda", 0),
        dtype="bfloat16",
        gradient_checkpointing=False,
        reshard_after_forward=True,
        param_offload=False,
    )
    bandwidth = copy_bandwidth()
    start = time.perf_counter()
    engine = VLLMRollout(
        folder,
        pad_id=0,
        eos_ids=[0],
        gpu_memory_utilization=0.2,
        max_model_len=1024,
        enforce_eager=True,
        load_format="dummy",
        skip_tokenizer_init=random_init,
    )
    engine_start = time.perf_counter() - start
    sent = [(n, tuple(p.shape)) for n, p in actor.named_parameters() if not (tied and n == "lm_head.weight")]
    bytes_bf16 = sum(2 * torch.Size(s).numel() for _, s in sent)
    floor_s = 2 * bytes_bf16 / bandwidth
    result = {
        "model": name,
        "params": params,
        "tied_embeddings": tied,
        "tensors_sent": len(sent),
        "bytes_sent_bf16": bytes_bf16,
        "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1),
        "floor_s": round(floor_s, 5),
        "engine_start_s": round(engine_start, 1),
        "by_bucket_mb": {},
    }

    def sync() -> dict:
        engine.sleep()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.update_weights(fsdp.full_named_parameters(actor))
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        engine.wake()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        return {"wake_weights_gather_load_s": t1 - t0, "wake_kv_cache_s": t2 - t1, "total_s": t2 - t0}

    # the load phase alone, engine awake (no allocator work): the part the floor describes
    def load_only() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.update_weights(fsdp.full_named_parameters(actor))
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def measured(label: str) -> dict:
        sync()  # warm-up
        runs = [sync() for _ in range(repeats)]
        loads = [load_only() for _ in range(repeats)]
        summary = {key: round(statistics.median(r[key] for r in runs), 4) for key in runs[0]}
        summary["load_only_awake_s"] = round(statistics.median(loads), 4)
        summary["load_only_over_floor"] = round(summary["load_only_awake_s"] / floor_s, 1)
        summary["load_only_gb_s"] = round(bytes_bf16 / summary["load_only_awake_s"] / 1e9, 1)
        print(name, label, json.dumps(summary), flush=True)
        return summary

    def engine_weights() -> list:
        return engine.llm.apply_model(lambda model: [p.detach().clone() for p in model.parameters()])[0]

    engine.update_weights(fsdp.full_named_parameters(actor))  # the first load: vLLM's loader, its calls recorded
    plan = engine.load_plan
    result["direct_refused"] = engine.load_plan_refused
    for bucket_mb in bucket_mbs:  # the baseline: vLLM's loader, bucket by bucket
        engine.replay_loads(None)
        engine.bucket_bytes = bucket_mb * 2**20
        result["by_bucket_mb"][str(bucket_mb)] = measured(f"vLLM's loader, {bucket_mb} MiB buckets:")
    if plan is not None:
        by_loader = engine_weights()
        engine.replay_loads(plan)
        result["direct"] = measured("direct copies:")
        result["direct_equals_loader"] = all(
            torch.equal(a, b) for a, b in zip(by_loader, engine_weights(), strict=True)
        )
        best = min(r["load_only_awake_s"] for r in result["by_bucket_mb"].values())
        result["direct_load_speedup"] = round(best / result["direct"]["load_only_awake_s"], 2)

    gib_awake = gpu_memory_in_use_gib()
    engine.sleep()
    result["gib_in_use_awake"] = round(gib_awake, 2)
    result["gib_in_use_engine_asleep"] = round(gpu_memory_in_use_gib(), 2)
    engine.update_weights(fsdp.full_named_parameters(actor))
    engine.wake()

    # correctness: engine log-probs of a fixed random sequence vs the actor's own forward
    from vllm import SamplingParams, TokensPrompt

    vocab = actor.config.vocab_size
    ids = torch.randint(0, vocab, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    out = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=ids)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )[0]
    got = torch.as_tensor([out.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i > 0])
    x = torch.as_tensor([ids], device="cuda")
    with torch.no_grad():
        ref = torch.log_softmax(actor(input_ids=x).logits[0, :-1].float(), -1).gather(-1, x[0, 1:, None])[:, 0]
    diff = (got - ref.cpu()).abs()
    result["logprob_abs_diff_mean"] = round(diff.mean().item(), 5)
    result["logprob_abs_diff_max"] = round(diff.max().item(), 5)
    engine.shutdown()  # vLLM's teardown also destroys the process group it joined
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen2-0.5b"])
    parser.add_argument("--bucket-mb", nargs="+", type=int, default=[64, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/weight_sync.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child mode: measure this model, print JSON
    args = parser.parse_args()

    if args.one:
        print("RESULT " + json.dumps(measure_one(args.one, args.bucket_mb, args.repeats)), flush=True)
        return 0

    import torch

    results = {"device": torch.cuda.get_device_name(0), "models": []}
    for name in args.models:
        cmd = [
            sys.executable,
            __file__,
            "--one",
            name,
            "--repeats",
            str(args.repeats),
            "--bucket-mb",
            *map(str, args.bucket_mb),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        print("\n".join(line for line in proc.stdout.splitlines() if not line.startswith("RESULT ")), flush=True)
        results["models"].append(
            json.loads(lines[-1][7:])
            if lines
            else {"model": name, "error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]}
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'model':<12}{'params':>12}{'MB bf16':>10}{'floor ms':>10}{'bucket':>8}{'sync s':>9}{'load s':>9}")
    for r in results["models"]:
        if "error" in r:
            print(r["model"], r["error"])
            continue
        ways = {**r["by_bucket_mb"], **({"direct": r["direct"]} if "direct" in r else {})}
        for way, s in ways.items():
            print(
                f"{r['model']:<12}{r['params']:>12,}{r['bytes_sent_bf16'] / 1e6:>10.0f}{r['floor_s'] * 1e3:>10.2f}"
                f"{way:>8}{s['total_s']:>9.3f}{s['load_only_awake_s']:>9.3f}"
            )
        print(
            f"{r['model']}: direct copies {r.get('direct_load_speedup')}x the best bucket's load, equal to vLLM's "
            f"loader: {r.get('direct_equals_loader')}; refused: {r.get('direct_refused')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
