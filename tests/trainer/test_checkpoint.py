"""Checkpoints: rotation, the latest marker, resume resolution, and loading with a different rank count."""

import json
import multiprocessing
import os
import socket
from pathlib import Path

import pytest
import torch

from kuberl.trainer import checkpoint as ckpt

TINY = "tiny://llama?hidden=32&layers=2&heads=2&kv_heads=1&seed=3"


def make_checkpoint(root: Path, step: int) -> Path:
    folder = ckpt.step_dir(root, step)
    folder.mkdir(parents=True)
    ckpt.write_state(folder, {"step": step})
    ckpt.mark_latest(root, folder)
    return folder


def test_rotation_keeps_the_newest_max_checkpoints(tmp_path):
    for step in (2, 4, 6, 8):
        make_checkpoint(tmp_path, step)
        ckpt.rotate(tmp_path, 2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [6, 8]
    assert ckpt.find_latest(tmp_path) == tmp_path / "global_step_8"


def test_rotation_is_off_without_max_checkpoints(tmp_path):
    for step in (1, 2, 3):
        make_checkpoint(tmp_path, step)
    assert ckpt.rotate(tmp_path, None) == []
    assert len(ckpt.list_checkpoints(tmp_path)) == 3


def test_incomplete_checkpoints_are_ignored(tmp_path):
    make_checkpoint(tmp_path, 1)
    (tmp_path / "global_step_2" / "actor").mkdir(parents=True)  # crashed while saving: no trainer_state.json
    assert ckpt.find_latest(tmp_path) == tmp_path / "global_step_1"


def test_latest_falls_back_to_the_highest_complete_step(tmp_path):
    make_checkpoint(tmp_path, 3)
    make_checkpoint(tmp_path, 5)
    (tmp_path / "latest").write_text("global_step_9\n")
    assert ckpt.find_latest(tmp_path) == tmp_path / "global_step_5"


def test_resume_modes(tmp_path):
    folder = make_checkpoint(tmp_path, 4)
    assert ckpt.resolve_resume("auto", tmp_path) == folder
    assert ckpt.resolve_resume("disable", tmp_path) is None
    assert ckpt.resolve_resume(str(folder), tmp_path / "elsewhere") == folder
    assert ckpt.resolve_resume("auto", tmp_path / "empty") is None


def test_resume_from_a_path_must_name_a_complete_global_step_folder(tmp_path):
    with pytest.raises(ValueError, match="global_step_N"):
        ckpt.resolve_resume(str(tmp_path), tmp_path)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ckpt.resolve_resume(str(tmp_path / "global_step_7"), tmp_path)


def test_rng_state_round_trips():
    state = ckpt.rng_state()
    expected = torch.rand(3)
    ckpt.set_rng_state(state)
    assert torch.equal(torch.rand(3), expected)


# --- rank-count independence ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(rank: int, world: int, port: int):
    import torch.distributed as dist

    from kuberl.trainer import fsdp
    from kuberl.trainer.models import load_causal_lm

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = fsdp.prepare(
        load_causal_lm(TINY, torch.float32),
        device=torch.device("cpu"),
        dtype="float32",
        gradient_checkpointing=False,
        reshard_after_forward=True,
        param_offload=False,
    )
    optimizer = fsdp.make_optimizer(model, lr=1e-2, weight_decay=0.0)
    scheduler = fsdp.make_scheduler(optimizer, warmup_steps=2, total_steps=10, kind="cosine", min_lr_ratio=0.1)
    return model, optimizer, scheduler


def save_with_ranks(rank: int, world: int, port: int, folder: str, out: str) -> None:
    import torch.distributed as dist

    from kuberl.trainer import fsdp

    model, optimizer, scheduler = build(rank, world, port)
    ids = torch.arange(12).reshape(2, 6) + 4 * rank
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    ckpt.save_sharded(folder, rank=rank, model=model, optimizer=optimizer, scheduler=scheduler)
    full = dict(fsdp.full_named_parameters(model))
    if rank == 0:
        torch.save({"params": full, "lr": optimizer.param_groups[0]["lr"]}, out)
    dist.destroy_process_group()


def load_and_step(rank: int, world: int, port: int, folder: str, out: str) -> None:
    import torch.distributed as dist

    from kuberl.trainer import fsdp

    model, optimizer, scheduler = build(rank, world, port)
    ckpt.load_sharded(folder, rank=rank, model=model, optimizer=optimizer, scheduler=scheduler)
    loaded = dict(fsdp.full_named_parameters(model))
    exp_avg = {
        name: fsdp.full_tensor(optimizer.state[p]["exp_avg"]).clone()
        for name, p in model.named_parameters()
        if p in optimizer.state
    }
    torch.save({"params": loaded, "lr": optimizer.param_groups[0]["lr"], "exp_avg": exp_avg}, out)
    dist.destroy_process_group()


def spawn(target, world: int, *args) -> None:
    context = multiprocessing.get_context("fork")
    port = free_port()
    procs = [context.Process(target=target, args=(rank, world, port, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


@pytest.mark.timeout(300)
def test_a_checkpoint_saved_by_two_ranks_loads_into_one(tmp_path):
    folder = tmp_path / "global_step_1" / "actor"
    saved, loaded = str(tmp_path / "saved.pt"), str(tmp_path / "loaded.pt")
    spawn(save_with_ranks, 2, str(folder), saved)
    assert sorted(os.listdir(folder)) == ["model.pt", "optim.pt", "rng_rank0.pt", "rng_rank1.pt", "scheduler.pt"]
    spawn(load_and_step, 1, str(folder), loaded)
    before, after = torch.load(saved), torch.load(loaded)
    assert before["params"].keys() == after["params"].keys()
    for name in before["params"]:
        torch.testing.assert_close(after["params"][name], before["params"][name], rtol=0, atol=0)
    assert after["lr"] == pytest.approx(before["lr"])
    optim = torch.load(folder / "optim.pt", weights_only=False)
    assert any(torch.count_nonzero(v) for v in after["exp_avg"].values())
    assert json.dumps(sorted(optim["state"]))  # keyed by parameter names, not rank-local indices
    assert all(isinstance(k, str) for k in optim["state"])
