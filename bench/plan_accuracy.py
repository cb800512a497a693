"""Benchmark (d): ``kuberl plan``'s per-GPU memory estimate ÷ the peak the trainer measured on the same RLJob.

The estimate is ``kuberl plan FILE -o json`` (no weights loaded). What it is compared with depends on the placement:

- colocated: the plan's peak (the larger of the train and generate phases) against the largest
  ``perf/max_memory_used_gb`` of the run, the device's memory in use as NVML samples it every 0.5 s (every
  allocator of the process). torch's ``perf/max_memory_allocated_gb`` is no measure here: vLLM allocates through
  torch's allocator in the same process, and its sleep returns the memory without lowering torch's high-water mark
  (on the H200 torch read 52.8 GiB where the device held 45.2 at most, close to both phases at once).
- separate: the trainer's GPU, i.e. the plan's train phase against the trainer process's largest
  ``perf/max_memory_allocated_gb`` (the engines are other processes). NVML's figure is reported beside it: on a
  shared layout (trainer and engine on one card) it holds both processes and the trainer's allocator cache.

The target is within 20%. Usage (GPU machine, after a run)::

    python bench/plan_accuracy.py --spec /tmp/bench/kuberl-rljob.yaml --metrics /tmp/bench/kuberl-run/metrics.jsonl \\
        --gpu H200 --out bench/results/plan_accuracy_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TOLERANCE = 0.20


def measured_peaks(metrics_file: Path) -> dict[str, float]:
    """The largest device-used, torch-allocated and torch-reserved GiB over the step records of ``metrics_file``."""
    records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    used = [r["perf/max_memory_used_gb"] for r in records if "perf/max_memory_used_gb" in r]
    if not used:
        raise SystemExit(f"{metrics_file}: no perf/max_memory_used_gb (a CPU run, no NVML, or no step finished)")
    return {
        "device_used_gib": max(used),
        "allocated_gib": max(r.get("perf/max_memory_allocated_gb", 0.0) for r in records),
        "reserved_gib": max(r.get("perf/max_memory_reserved_gb", 0.0) for r in records),
        "steps": len(used),
    }


def comparison(plan: dict[str, Any], peaks: dict[str, float]) -> tuple[str, float, float]:
    """(what is compared, planned GiB, measured GiB) for the plan's placement (see the module's docstring)."""
    if plan["placement"] == "separate":
        return (
            "train phase ÷ the trainer process's torch-allocated peak",
            plan["train_phase_gib"],
            peaks["allocated_gib"],
        )
    return "peak ÷ the device's peak memory in use (NVML)", plan["peak_gib"], peaks["device_used_gib"]


def planned(spec: Path, gpu: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "kuberl.cli", "plan", str(spec), "--gpu", gpu, "-o", "json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True, help="the RLJob file that ran")
    parser.add_argument("--metrics", type=Path, required=True, help="that run's metrics.jsonl")
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    plan = planned(args.spec, args.gpu)
    peaks = measured_peaks(args.metrics)
    compared, planned_gib, measured_gib = comparison(plan, peaks)
    ratio = planned_gib / measured_gib
    result = {
        "benchmark": f"kuberl plan {compared}",
        "spec": str(args.spec),
        "gpu": args.gpu,
        "placement": plan["placement"],
        "planned": {k: plan[k] for k in ("peak_gib", "train_phase_gib", "generate_phase_gib", "micro_batch")},
        "measured": peaks,
        "ratio": round(ratio, 3),
        "within_tolerance": abs(ratio - 1) <= TOLERANCE,
    }
    print(
        f"{plan['placement']}: plan {planned_gib:.1f} GiB / measured {measured_gib:.1f} GiB = {ratio:.2f}x ({compared}; "
        f"plan train {plan['train_phase_gib']:.1f}, generate {plan['generate_phase_gib']:.1f}; device "
        f"{peaks['device_used_gib']:.1f} in use, torch {peaks['allocated_gib']:.1f} allocated, "
        f"{peaks['reserved_gib']:.1f} reserved)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
