"""Benchmark (d): ``kuberl plan``'s per-GPU memory ÷ the peak the card held during a run of the same RLJob.

The estimate is ``kuberl plan FILE --gpus 1 -o json`` (no weights loaded; one GPU, so a separate rollout is the shared
layout), and its peak is compared with the largest ``perf/max_memory_used_gb`` of the run: the device's memory in use
as NVML samples it every 0.5 s, every process on the card (trainer, engines). The plan counts all of them
(kuberl.api.memory's docstring); torch's counters are reported beside it. The end-to-end benchmarks record the same
comparison for each of their rows (bench/grpo_bench.py); ``tests/bench/test_plan_measured.py`` checks every committed
one. The target is within 10% above, never below. Usage (GPU machine, after a run)::

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

TOLERANCE = 0.10


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


def planned(spec: Path, gpu: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "kuberl.cli", "plan", str(spec), "--gpu", gpu, "--gpus", "1", "-o", "json"]
    return json.loads(subprocess.run(cmd, check=False, capture_output=True, text=True).stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True, help="the RLJob file that ran")
    parser.add_argument("--metrics", type=Path, required=True, help="that run's metrics.jsonl")
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    plan = planned(args.spec, args.gpu)
    peaks = measured_peaks(args.metrics)
    ratio = plan["peak_gib"] / peaks["device_used_gib"]
    result = {
        "benchmark": "kuberl plan's peak ÷ the card's peak memory in use (NVML)",
        "spec": str(args.spec),
        "gpu": args.gpu,
        "layout": plan["layout"],
        "planned": {k: plan[k] for k in ("peak_gib", "phases_gib", "micro_batch", "fits")},
        "measured": peaks,
        "ratio": round(ratio, 3),
        "within_tolerance": 1.0 <= ratio <= 1 + TOLERANCE,
    }
    print(
        f"{plan['layout']}: plan {plan['peak_gib']:.1f} GiB / measured {peaks['device_used_gib']:.1f} GiB = "
        f"{ratio:.2f}x (phases {', '.join(f'{k} {v:.1f}' for k, v in plan['phases_gib'].items())}; torch "
        f"{peaks['allocated_gib']:.1f} allocated, {peaks['reserved_gib']:.1f} reserved)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
