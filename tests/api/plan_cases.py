"""RLJobs whose memory admission can plan (model.shape, a GPU in the trainer pool's node selector): the benchmark's
runs of issue 35 (their specs: tests/bench/test_plan_measured.py) with the 1.14B llama's shape, on H100 nodes: those
that died for memory one step off, a colocated one with a token budget the plan refuses, and both with the budget
left out.

Shared by the offline tests of the memory verdict (tests/api/test_memory_admission.py) and the operator's
(e2e/operator/test_memory_admission.py), which assert the same verdict.
"""

from __future__ import annotations

import copy
from typing import Any

from bench.shapes import LLAMA_11B
from kuberl.api.contract import GROUP, KIND, VERSION
from kuberl.api.spec import ConfigShape
from tests.bench.test_plan_measured import OOM_CASES, oom_spec

H100_SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
"""NVIDIA GPU feature discovery's label of an H100 80GB node."""
LLAMA_11B_SHAPE = ConfigShape.model_validate({k: v for k, v in LLAMA_11B.items() if k in ConfigShape.model_fields})
"""bench/shapes.py's 1.14B llama as model.shape."""
QWEN2_5_0_5B_SHAPE = {
    "vocabSize": 151936,
    "hiddenSize": 896,
    "numHiddenLayers": 24,
    "numAttentionHeads": 14,
    "numKeyValueHeads": 2,
    "intermediateSize": 4864,
    "tieWordEmbeddings": True,
    "attentionBias": True,
}
"""Qwen2.5-0.5B's config.json as model.shape (494,032,768 parameters)."""


def on_h100(name: str, spec: dict[str, Any], selector: dict[str, str] | None = None) -> dict[str, Any]:
    """An RLJob of `spec` whose model.shape is the 1.14B llama's and whose trainer pool selects `selector` (H100
    nodes by default)."""
    spec = copy.deepcopy(spec)
    spec["model"]["shape"] = LLAMA_11B_SHAPE.model_dump(by_alias=True, exclude_none=True)
    spec["cluster"]["trainer"]["nodeSelector"] = dict(H100_SELECTOR if selector is None else selector)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name}, "spec": spec}


COLOCATED_UTILIZATIONS = [utilization for separate, utilization in OOM_CASES if not separate]
"""vLLM's memory shares of the colocated runs of the four."""
ONE_STEP_OFF_OOM_UTILIZATIONS = [utilization for separate, utilization in OOM_CASES if separate]
"""The one-step-off runs: they died with the engine on the trainer's card, which a cluster's rollout pool does not
share; on H100 nodes the trainer alone fits its card."""
TOO_LARGE_TOKEN_BUDGET = 49152
"""A token budget whose colocated 1.14B update the plan puts at 97 GiB of an H100's 79.7 (35,840 fits)."""


def oom_rljob(name: str, *, separate: bool, utilization: float) -> dict[str, Any]:
    """One of the four runs that died on an H100 (maxTokenLenPerGPU 32768), on H100 nodes."""
    return on_h100(name, oom_spec(separate=separate, utilization=utilization))


def too_large_spec(utilization: float = 0.2) -> dict[str, Any]:
    """The colocated run at :data:`TOO_LARGE_TOKEN_BUDGET`: the job an H100 cannot hold."""
    spec = oom_spec(separate=False, utilization=utilization)
    spec["batch"]["dynamicBatchSize"]["maxTokenLenPerGPU"] = TOO_LARGE_TOKEN_BUDGET
    return spec


def too_large_rljob(name: str, *, utilization: float = 0.2) -> dict[str, Any]:
    """:func:`too_large_spec` on H100 nodes."""
    return on_h100(name, too_large_spec(utilization))


def fitting_rljob(name: str, *, separate: bool) -> dict[str, Any]:
    """The same run with the token budget left out: the trainer takes the largest that fits."""
    doc = oom_rljob(name, separate=separate, utilization=0.3)
    del doc["spec"]["batch"]["dynamicBatchSize"]["maxTokenLenPerGPU"]
    return doc
