"""A small, valid RLJob for the operator's tests and its scale benchmark (CPU, tiny model, 2 ranks)."""

from __future__ import annotations

from typing import Any

from kuberl.api.contract import GROUP, VERSION


def rljob(name: str, **spec_changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"path": "tiny://llama?hidden=64&layers=2"},
        "algorithm": {"advantageEstimator": "grpo"},
        "data": {"trainFiles": ["/data/train.parquet"], "maxPromptLength": 64, "maxResponseLength": 8},
        "batch": {"trainBatchSize": 8, "rolloutN": 4, "ppoMiniBatchSize": 4, "ppoMicroBatchSizePerGPU": 4},
        "rollout": {"engine": "hf"},
        "cluster": {
            "device": "cpu",
            "trainer": {"nodes": 1, "gpusPerNode": 2, "cpu": "2", "memory": "4Gi", "sharedMemory": "1Gi"},
        },
    }
    for path, value in spec_changes.items():
        target = spec
        *parents, leaf = path.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = value
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}
