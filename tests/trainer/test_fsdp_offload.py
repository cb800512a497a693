"""optimizerOffload: AdamW moments visit the compute device only during an update."""

from __future__ import annotations

import pytest
import torch

from kuberl.trainer.model import fsdp


def _stepped_optimizer() -> torch.optim.Optimizer:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    return optimizer


def test_moving_the_state_moves_the_moments_and_keeps_the_step_counter() -> None:
    optimizer = _stepped_optimizer()
    fsdp._move_optimizer_state(optimizer, torch.device("meta"))
    for state in optimizer.state.values():
        assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta
        assert not state["step"].is_meta


def test_state_goes_to_the_device_for_the_update_and_back_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    moves: list[str] = []
    monkeypatch.setattr(fsdp, "_move_optimizer_state", lambda opt, device: moves.append(device.type))
    with fsdp.optimizer_state_on(_stepped_optimizer(), torch.device("cuda"), offload=True):
        assert moves == ["cuda"]
    assert moves == ["cuda", "cpu"]


def test_without_offload_nothing_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    moves: list[str] = []
    monkeypatch.setattr(fsdp, "_move_optimizer_state", lambda opt, device: moves.append(device.type))
    with fsdp.optimizer_state_on(_stepped_optimizer(), torch.device("cuda"), offload=False):
        pass
    assert moves == []
