"""The actor's update queues each micro-batch's work without waiting for the GPU: it makes as many synchronizing
CUDA calls (torch's sync debug mode) in four micro-batches as in one. A wait inside the micro-batch loop drains the
device, which then idles while the host packs the next micro-batch and launches its forward."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

from kuberl.api.spec import RLJobSpec
from kuberl.trainer.plan.execution import plan_execution
from kuberl.trainer.plan.layout import ClusterFacts
from kuberl.trainer.rollout.weight_sync import free_port
from kuberl.trainer.workers.actor import ActorWorker
from kuberl.trainer.workers.base import load_trainer_model
from tests.gpu.test_packed_passes import ragged_rows

pytestmark = pytest.mark.gpu

TINY = "tiny://llama?hidden=256&layers=2&heads=4&kv_heads=2&seed=0"
ROWS = 16


def job_spec(micro_batch: int, compile_layers: bool) -> RLJobSpec:
    return RLJobSpec.model_validate(
        {
            "model": {"path": TINY, "dtype": "bfloat16", "compile": compile_layers},
            "algorithm": {"advantageEstimator": "grpo"},
            "data": {"trainFiles": ["unused.parquet"], "maxPromptLength": 32, "maxResponseLength": 32},
            "batch": {"trainBatchSize": ROWS, "ppoMiniBatchSize": ROWS, "ppoMicroBatchSizePerGPU": micro_batch},
            "cluster": {"device": "cuda", "trainer": {"nodes": 1, "gpusPerNode": 1}},  # one rank: this process
        }
    )


def update_rows(vocab: int) -> dict[str, torch.Tensor]:
    """Ragged rows with one advantage per response and no old log-probs, so the update also takes them from its own
    forward and sends them back (the plan's default with one mini-batch and one epoch)."""
    rows = ragged_rows(ROWS, 32, 32, vocab)
    g = torch.Generator().manual_seed(1)
    rows["advantages"] = torch.randn(ROWS, 1, generator=g).expand(ROWS, 32).contiguous()
    return rows


def synchronizing_calls(fn: Callable[[], object]) -> list[str]:
    """Where ``fn`` made the host wait for the GPU (``file:line`` of the Python call that waited, once per wait), as
    torch's sync debug mode reports them."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{w.filename}:{w.lineno}" for w in caught if "synchronizing" in str(w.message)]


@pytest.mark.parametrize("compile_layers", [False, True], ids=["eager", "compiled"])
def test_update_waits_for_the_gpu_as_often_in_four_micro_batches_as_in_one(compile_layers: bool, record) -> None:
    first = job_spec(ROWS, compile_layers)
    worker = ActorWorker(first, plan_execution(first, ClusterFacts(gpus=1, local_cpus=4)), 0)
    worker.init_distributed("127.0.0.1", free_port())
    try:
        worker.build_policy(load_trainer_model(TINY), total_steps=8)
        rows = update_rows(worker.config.vocab_size)
        totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": float(ROWS)}]
        calls = {}
        for micro in (ROWS, ROWS // 4):
            worker.spec = job_spec(micro, compile_layers)
            worker.plan = plan_execution(worker.spec)
            worker.update([rows], totals)  # warm-up: compilation, allocator, pinned host buffers
            calls[micro] = synchronizing_calls(lambda: worker.update([rows], totals))
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
    record[f"synchronizing_calls_by_micro_batch_rows_{'compiled' if compile_layers else 'eager'}"] = calls
    assert len(calls[ROWS // 4]) == len(calls[ROWS]), (
        f"synchronizing CUDA calls per update by micro-batch rows: {calls}"
    )
