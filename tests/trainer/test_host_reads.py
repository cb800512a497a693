"""The actor's and the critic's passes read no device value back on the host per micro-batch: on CPU the same code
runs under a dispatch mode that marks every tensor the model, the optimizer or the backward produced as
device-resident and records each operator that would make the host wait for a GPU (a scalar read, an output whose
shape depends on the values, a boolean-mask index). Four micro-batches must record as many as one.

tests/gpu/test_update_syncs.py checks the same with CUDA's own sync debug mode on a GPU; this tier catches the kind
that needs no GPU (a masked scatter's backward, an ``.item()`` on a loss) in CPU CI. It cannot see copies to the
host (``.cpu()``, ``.tolist()``), which are no-ops on CPU."""

from __future__ import annotations

import traceback
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kuberl.api.spec import RLJobSpec
from kuberl.trainer.model.loading import parse_tiny, tiny_config
from kuberl.trainer.model.microbatch import Rows
from kuberl.trainer.plan.execution import plan_execution
from kuberl.trainer.rollout.weight_sync import free_port
from kuberl.trainer.workers.actor import ActorWorker
from kuberl.trainer.workers.base import load_trainer_model
from kuberl.trainer.workers.critic import CriticWorker
from tests.trainer.test_packing import ragged_rows

TINY = "tiny://llama?hidden=64&layers=2&heads=4&kv_heads=2&seed=0"
ROWS = 16
LENGTH = 32
HOST_READ_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
UNTAGGED_HOST_READS = {
    "aten.is_nonzero.default",
    "aten.masked_scatter_backward.default",  # selects by mask: the kept count is read back
}


class DeviceReads(TorchDispatchMode):
    """Counts, by operator and the trainer's ``file:line`` that called it, host reads of device-resident tensors:
    the tensors given at the start, everything computed from them and everything the backward computes."""

    def __init__(self, device_tensors: Iterable[Tensor]) -> None:
        super().__init__()
        self.resident: dict[int, weakref.ref[Tensor]] = {}
        self.reads: Counter[str] = Counter()
        for tensor in device_tensors:
            self.mark(tensor)

    def mark(self, tensor: Tensor) -> None:
        self.resident[id(tensor)] = weakref.ref(tensor)

    def is_resident(self, tensor: Tensor) -> bool:
        ref = self.resident.get(id(tensor))
        return (ref is not None and ref() is tensor) or (tensor._base is not None and self.is_resident(tensor._base))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        in_backward = torch._C._current_graph_task_id() != -1
        resident = in_backward or any(self.is_resident(t) for t in inputs)
        if resident and reads_back(func, args):
            self.reads[f"{func} at {trainer_line()}"] += 1
        out = func(*args, **kwargs)
        if resident:
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, Tensor):
                    self.mark(tensor)
        return out


def reads_back(func: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``func`` on a GPU waits for the values of its inputs. ``aten.index`` carries the dynamic-shape tag for
    its boolean-mask form only: an integer index keeps the shape."""
    if str(func).startswith("aten.index."):
        return any(isinstance(i, Tensor) and i.dtype == torch.bool for i in args[1])
    return any(tag in func.tags for tag in HOST_READ_TAGS) or str(func) in UNTAGGED_HOST_READS


def trainer_line() -> str:
    frames = [f for f in traceback.extract_stack()[:-1] if "/kuberl/" in f.filename]
    return f"{frames[-1].filename.rsplit('/kuberl/', 1)[-1]}:{frames[-1].lineno}" if frames else "outside kuberl"


def job_spec(micro_batch: int) -> RLJobSpec:
    """A PPO job (GAE, so it has a critic) whose actor and critic cut ``ROWS`` rows into ``micro_batch``-row passes."""
    return RLJobSpec.model_validate(
        {
            "model": {"path": TINY, "dtype": "float32"},
            "algorithm": {"advantageEstimator": "gae"},
            "critic": {"ppoMicroBatchSizePerGPU": micro_batch},
            "data": {"trainFiles": ["unused.parquet"], "maxPromptLength": LENGTH, "maxResponseLength": LENGTH},
            "batch": {"trainBatchSize": ROWS, "ppoMiniBatchSize": ROWS, "ppoMicroBatchSizePerGPU": micro_batch},
            "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},  # one rank: this process
        }
    )


def ppo_rows(vocab: int) -> Rows:
    """Ragged rows (lengths drawn at random) with advantages, old values and returns."""
    g = torch.Generator().manual_seed(0)
    prompt_lens = torch.randint(LENGTH // 4, LENGTH + 1, (ROWS,), generator=g).tolist()
    response_lens = torch.randint(1, LENGTH + 1, (ROWS,), generator=g).tolist()
    rows = ragged_rows(prompt_lens, response_lens, vocab)
    shape = rows["responses"].shape
    return {**rows, "values": torch.randn(shape, generator=g), "returns": torch.randn(shape, generator=g)}


@contextmanager
def worker_for(role: str) -> Iterator[ActorWorker | CriticWorker]:
    spec = job_spec(ROWS)
    worker = {"actor": ActorWorker, "critic": CriticWorker}[role](spec, plan_execution(spec), 0)
    worker.init_distributed("127.0.0.1", free_port())
    try:
        if isinstance(worker, ActorWorker):
            worker.build_policy(load_trainer_model(TINY), total_steps=8)
        else:
            worker.init_model(total_steps=8)
        yield worker
    finally:
        dist.destroy_process_group()


def resident_state(worker: ActorWorker | CriticWorker) -> list[Tensor]:
    """Parameters, buffers and optimizer state as the operators see them (FSDP's local shards)."""
    state = [*worker.model.parameters(), *worker.model.buffers()]
    state += [v for s in worker.optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
    return [getattr(t, "_local_tensor", t) for t in state]


def reads_by_micro_batch(worker: ActorWorker | CriticWorker, run: Callable[[], object]) -> dict[int, Counter[str]]:
    reads = {}
    for micro in (ROWS, ROWS // 4):
        worker.spec = job_spec(micro)
        worker.plan = plan_execution(worker.spec)
        run()  # the optimizer creates its state on the first step
        with DeviceReads(resident_state(worker)) as mode:
            run()
        reads[micro] = mode.reads
    return reads


@pytest.mark.parametrize(
    "role,pass_name", [("actor", "update"), ("actor", "forward"), ("critic", "update"), ("critic", "forward")]
)
def test_passes_read_back_as_often_in_four_micro_batches_as_in_one(role: str, pass_name: str) -> None:
    with worker_for(role) as worker:
        rows = ppo_rows(tiny_config(parse_tiny(TINY)).vocab_size)
        totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": float(ROWS)}]
        if pass_name == "update":
            run: Callable[[], object] = lambda: worker.update([rows], totals)  # noqa: E731
        elif isinstance(worker, ActorWorker):
            run = lambda: worker.compute_log_probs(rows)  # noqa: E731
        else:
            run = lambda: worker.compute_values(rows)  # noqa: E731
        reads = reads_by_micro_batch(worker, run)
    assert reads[ROWS // 4] == reads[ROWS], (
        f"{role} {pass_name}: host reads of device values by micro-batch rows: {reads}"
    )


def test_a_masked_scatter_backward_is_seen_as_a_host_read() -> None:
    """The instrument itself: the read that tests/gpu/test_update_syncs.py found on the H200 is recorded here."""
    values = torch.randn(2, 3, requires_grad=True)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    with DeviceReads([]) as mode:
        torch.zeros(2, 3).masked_scatter(mask, values).sum().backward()
        values.detach()[mask]
    assert any(key.startswith("aten.masked_scatter_backward") for key in mode.reads), mode.reads
    assert not any(key.startswith("aten.index") for key in mode.reads), "a host tensor was taken for a device one"
