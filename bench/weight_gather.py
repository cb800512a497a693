"""The gather half of a colocated weight sync, four ways, on one GPU: what one collective per parameter costs.

The colocated sync (bench/weight_sync.py) spent ~0.125 ms a tensor at any size, far above the copy floor. Its
first half is the trainer's gather, ``fsdp.full_named_parameters``, then the cast to the rollout's bf16. This script
times four ways on the trainer's own FSDP2 sharding (``fsdp.shard``, bf16 compute over fp32 weights):

- ``per_parameter``: one ``full_tensor()`` all-gather per parameter: the trainer's path over several ranks, and on one
  rank before it read the local shard (the baseline of every ratio printed);
- ``per_module``: ``unshard()`` each FSDP module once (one all-gather of its whole parameter group, already in the
  compute dtype), copy its parameters out, ``reshard()``;
- ``local``: ``fsdp.full_named_parameters`` as the trainer runs it; on one rank the local shard is the whole tensor,
  read without a collective;
- ``local_detached_first``: the same read with each parameter detached before it, as the trainer did until
  2026-12-07 (``detach()`` of a DTensor goes through its dispatch: the difference to ``local`` is that cost).

Each way's tensors are checked equal to the baseline's. Median of ``--repeats`` after one warm-up.

    python bench/weight_gather.py --models qwen2-0.5b smollm2-shape --repeats 5 --out weight_gather.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.shapes import random_causal_lm
from kuberl.trainer.model.fsdp import full_named_parameters, full_tensor, shard
from kuberl.trainer.rollout.weight_sync import free_port

ROLLOUT_DTYPE = torch.bfloat16
Gather = Callable[[nn.Module], Iterator[tuple[str, Tensor]]]


def per_parameter(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    for name, param in model.named_parameters():
        tensor = param.detach()
        yield name, (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).to(ROLLOUT_DTYPE)


def per_module(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    fsdp_modules = {id(m) for m in model.modules() if isinstance(m, FSDPModule)}
    for prefix, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        module.unshard()
        for name, param in own_parameters(module, fsdp_modules):
            yield f"{prefix}.{name}" if prefix else name, param.detach().to(ROLLOUT_DTYPE, copy=True)
        module.reshard()


def own_parameters(module: nn.Module, fsdp_modules: set[int]) -> Iterator[tuple[str, Tensor]]:
    """``module``'s parameters that no FSDP module below it holds (its own parameter group)."""
    nested = [f"{p}." for p, m in module.named_modules() if m is not module and id(m) in fsdp_modules]
    for name, param in module.named_parameters():
        if not name.startswith(tuple(nested)):
            yield name, param


def local(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    for name, tensor in full_named_parameters(model):
        yield name, tensor.to(ROLLOUT_DTYPE)


def local_detached_first(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    for name, param in model.named_parameters():
        yield name, full_tensor(param.detach()).to(ROLLOUT_DTYPE)


WAYS: dict[str, Gather] = {
    "per_parameter": per_parameter,
    "per_module": per_module,
    "local": local,
    "local_detached_first": local_detached_first,
}


def timed(gather: Gather, model: nn.Module, repeats: int) -> tuple[float, dict[str, Tensor]]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    seconds = []
    out: dict[str, Tensor] = {}
    for _ in range(repeats + 1):
        sync()
        start = time.perf_counter()
        out = dict(gather(model))
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[1:]), out


def measure(name: str, repeats: int, device: str) -> dict[str, Any]:
    model = shard(random_causal_lm(name, device), device_type=device, dtype="bfloat16")
    tensors = sum(1 for _ in model.parameters())
    timings = {way: timed(gather, model, repeats) for way, gather in WAYS.items()}
    baseline_s, baseline = timings["per_parameter"]
    ways: dict[str, dict[str, Any]] = {}
    for way, (seconds, got) in timings.items():
        if sorted(got) != sorted(baseline):
            raise AssertionError(f"{way}: names differ from per_parameter: {sorted(set(got) ^ set(baseline))[:5]}")
        ways[way] = {
            "seconds": round(seconds, 5),
            "ms_per_tensor": round(1000 * seconds / tensors, 4),
            "baseline_over_this": round(baseline_s / seconds, 2),
            "equal_to_baseline": all(torch.equal(got[k], baseline[k]) for k in baseline),
        }
    return {"model": name, "tensors": tensors, "ways": ways}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["qwen2-0.5b", "smollm2-shape"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a check of the ways (gloo)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    rows = []
    for name in args.models:
        rows.append(measure(name, args.repeats, args.device))
        for way, figures in rows[-1]["ways"].items():
            print(f"{name:14s} {way:14s} {figures}", flush=True)
    dist.destroy_process_group()
    if args.out:
        results = {"device": card, "torch": torch.__version__, "models": rows}
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
