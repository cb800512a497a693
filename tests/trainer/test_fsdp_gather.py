"""fsdp.full_tensor and full_named_parameters on one rank (one GPU, FSDP2-sharded): the local shard is the whole
tensor, read without a gather; over several ranks they gather (tests/trainer/test_checkpoint.py, test_workers.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from kuberl.trainer.model import fsdp
from kuberl.trainer.model.loading import load_causal_lm

TINY = "tiny://llama?hidden=32&layers=2&heads=2&kv_heads=1&seed=3"


@pytest.fixture
def one_rank() -> Iterator[None]:
    assert not dist.is_initialized()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def gathers_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: DTensor, **kwargs: object) -> torch.Tensor:
        raise AssertionError("gathered over one rank")

    monkeypatch.setattr(DTensor, "full_tensor", refuse)


def test_one_rank_reads_the_local_shard_as_the_whole_tensor(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = torch.randn(7, 3)
    sharded = distribute_tensor(whole, init_device_mesh("cpu", (1,)), [Shard(0)])
    gathers_refused(monkeypatch)
    got = fsdp.full_tensor(sharded)
    assert not isinstance(got, DTensor) and torch.equal(got, whole)
    assert got.data_ptr() == sharded.to_local().data_ptr()


def test_one_rank_sharded_model_gives_every_parameter_whole(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = load_causal_lm(TINY, torch.float32)
    expected = {name: p.detach().clone() for name, p in plain.named_parameters()}
    model = fsdp.shard(load_causal_lm(TINY, torch.float32), device_type="cpu", dtype="float32")
    assert all(isinstance(p, DTensor) for p in model.parameters())
    gathers_refused(monkeypatch)
    got = dict(fsdp.full_named_parameters(model))
    assert sorted(got) == sorted(expected)
    for name, tensor in got.items():
        assert not isinstance(tensor, DTensor) and torch.equal(tensor, expected[name]), name
