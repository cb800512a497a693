"""Benchmark (d): ``kuberl plan``'s per-GPU memory estimate ÷ the peak the trainer measured on the same RLJob.

The estimate is ``kuberl plan FILE -o json`` (no weights loaded); the measurement is the largest
``perf/max_memory_allocated_gb`` (torch's peak on the trainer's GPU, every role of a colocated job in one process)
and ``perf/max_memory_reserved_gb`` over the steps of a finished ``kuberl run`` of that file. The target is the
plan's peak within 20% of the measured allocation. Usage (GPU machine, after a run)::

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
    """The largest allocated and reserved GiB over every step record of ``metrics_file``."""
    records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    allocated = [r["perf/max_memory_allocated_gb"] for r in records if "perf/max_memory_allocated_gb" in r]
    if not allocated:
        raise SystemExit(f"{metrics_file}: no perf/max_memory_allocated_gb (a CPU run, or no step finished)")
    reserved = [r.get("perf/max_memory_reserved_gb", 0.0) for r in records]
    return {"allocated_gib": max(allocated), "reserved_gib": max(reserved), "steps": len(allocated)}


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
    ratio = plan["peak_gib"] / peaks["allocated_gib"]
    result = {
        "benchmark": "kuberl plan peak GiB ÷ measured peak allocated GiB",
        "spec": str(args.spec),
        "gpu": args.gpu,
        "planned": {k: plan[k] for k in ("peak_gib", "train_phase_gib", "generate_phase_gib", "micro_batch")},
        "measured": peaks,
        "ratio": round(ratio, 3),
        "within_tolerance": abs(ratio - 1) <= TOLERANCE,
    }
    print(
        f"plan {plan['peak_gib']:.1f} GiB (train {plan['train_phase_gib']:.1f}, generate "
        f"{plan['generate_phase_gib']:.1f}) / measured {peaks['allocated_gib']:.1f} GiB allocated "
        f"({peaks['reserved_gib']:.1f} reserved) = {ratio:.2f}x"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["within_tolerance"] else 1


if __name__ == "__main__":
    sys.exit(main())
