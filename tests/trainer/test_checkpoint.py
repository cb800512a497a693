"""Checkpoints: atomic sealed writes, verified resume with fallback, identity, rotation, any rank count."""

import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kuberl.trainer.checkpoint import files as ckpt
from kuberl.trainer.checkpoint import folder as ckpt_folder
from kuberl.trainer.checkpoint import shards

TINY = "tiny://llama?hidden=32&layers=2&heads=2&kv_heads=1&seed=3"
REPO = Path(__file__).resolve().parents[2]


def seal(folder: Path, step: int, identity: ckpt.Identity | None = None) -> None:
    """Give ``folder/actor`` the files a worker's save leaves that are still missing (DCP indexes, a scheduler),
    then seal it as the driver does."""
    for name in ckpt.ROLE_FILES:
        path = folder / "actor" / name
        if not path.exists():
            ckpt.write_atomic(path, lambda f: f.write(b"{}"))
    ckpt.write_state(folder, {"step": step}, identity, roles=("actor",))


def make_checkpoint(root: Path, step: int, identity: ckpt.Identity | None = None, size: int = 4096) -> Path:
    """A sealed checkpoint with a model file of ``size`` bytes (what a driver does after the workers saved)."""
    folder = ckpt.prepare(root, step)
    ckpt.write_atomic(folder / "actor" / "model" / "__0_0.distcp", lambda f: f.write(os.urandom(size)))
    seal(folder, step, identity)
    ckpt.mark_latest(root, folder)
    return folder


def test_rotation_keeps_the_newest_max_checkpoints(tmp_path):
    for step in (2, 4, 6, 8):
        make_checkpoint(tmp_path, step)
        ckpt.rotate(tmp_path, 2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [6, 8]
    assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "global_step_8"


def test_rotation_is_off_without_max_checkpoints(tmp_path):
    for step in (1, 2, 3):
        make_checkpoint(tmp_path, step)
    assert ckpt.rotate(tmp_path, None) == []
    assert len(ckpt.list_checkpoints(tmp_path)) == 3


def test_rotation_never_deletes_the_newest_verified_checkpoint(tmp_path):
    make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2)
    newest = make_checkpoint(tmp_path, 3)
    (newest / "actor" / "model" / "__0_0.distcp").write_bytes(b"torn")
    ckpt.rotate(tmp_path, 1)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3]
    assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "global_step_2"


def test_the_manifest_lists_every_file_with_size_and_hash(tmp_path):
    folder = make_checkpoint(tmp_path, 5, size=1000)
    files = ckpt.read_manifest(folder)["files"]
    assert sorted(files) == [
        "actor/model/.metadata",
        "actor/model/__0_0.distcp",
        "actor/optim/.metadata",
        "actor/scheduler.json",
        "driver_rng.pt",
        "trainer_state.json",
    ]
    assert files["actor/model/__0_0.distcp"]["size"] == 1000
    assert not list(tmp_path.rglob("*.partial"))
    assert ckpt.verify(folder) is None


def test_incomplete_checkpoints_are_removed_on_resume(tmp_path):
    make_checkpoint(tmp_path, 1)
    (tmp_path / "global_step_2" / "actor").mkdir(parents=True)  # crashed while saving: no manifest.json
    assert ckpt.resolve_resume("auto", tmp_path) == tmp_path / "global_step_1"
    assert not (tmp_path / "global_step_2").exists()


def test_a_truncated_model_file_falls_back_to_the_previous_checkpoint(tmp_path):
    make_checkpoint(tmp_path, 3)
    newest = make_checkpoint(tmp_path, 5)
    model_file = newest / "actor" / "model" / "__0_0.distcp"
    with open(model_file, "r+b") as f:
        f.truncate(100)
    damaged: list[ckpt.Damaged] = []
    assert ckpt.resolve_resume("auto", tmp_path, damaged=damaged) == tmp_path / "global_step_3"
    assert [d.folder for d in damaged] == [newest]
    assert "100 bytes" in damaged[0].reason and "truncated" in damaged[0].reason


def test_a_flipped_byte_is_detected_by_the_hash(tmp_path):
    folder = make_checkpoint(tmp_path, 3)
    model_file = folder / "actor" / "model" / "__0_0.distcp"
    data = bytearray(model_file.read_bytes())
    data[10] ^= 0xFF
    model_file.write_bytes(bytes(data))
    assert "sha256" in (ckpt.verify(folder) or "")


def test_resume_modes(tmp_path):
    folder = make_checkpoint(tmp_path, 4)
    assert ckpt.resolve_resume("auto", tmp_path) == folder
    assert ckpt.resolve_resume("disable", tmp_path) is None
    assert ckpt.resolve_resume(str(folder), tmp_path / "elsewhere") == folder
    assert ckpt.resolve_resume("auto", tmp_path / "empty") is None


def test_resume_from_a_path_must_name_a_complete_verified_global_step_folder(tmp_path):
    with pytest.raises(ValueError, match="global_step_N"):
        ckpt.resolve_resume(str(tmp_path), tmp_path)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ckpt.resolve_resume(str(tmp_path / "global_step_7"), tmp_path)
    folder = make_checkpoint(tmp_path, 8)
    (folder / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match=r"damaged.*missing"):
        ckpt.resolve_resume(str(folder), tmp_path)


def test_another_jobs_checkpoints_are_refused(tmp_path):
    make_checkpoint(tmp_path, 2, ckpt.Identity(uid="uid-a", spec_hash="h"))
    with pytest.raises(ckpt.CheckpointMismatch, match=r"another RLJob .*uid-a.*trainer\.resume"):
        ckpt.resolve_resume("auto", tmp_path, ckpt.Identity(uid="uid-b", spec_hash="h"))
    assert ckpt.resolve_resume("auto", tmp_path, ckpt.Identity(uid="uid-a", spec_hash="h")) is not None


def test_a_changed_spec_is_refused_unless_resume_names_the_path(tmp_path):
    folder = make_checkpoint(tmp_path, 2, ckpt.Identity(uid=None, spec_hash="old"))
    with pytest.raises(ckpt.CheckpointMismatch, match=r"different spec\.model/data/algorithm/batch"):
        ckpt.resolve_resume("auto", tmp_path, ckpt.Identity(uid=None, spec_hash="new"))
    assert ckpt.resolve_resume(str(folder), tmp_path, ckpt.Identity(uid=None, spec_hash="new")) == folder


def test_the_resume_hash_covers_model_data_algorithm_batch_only():
    from kuberl.api.spec import RLJobSpec

    base = {"model": {"path": TINY}, "data": {"trainFiles": ["a.parquet"]}, "reward": {"function": "default"}}
    spec = RLJobSpec.model_validate(base)
    more_steps = RLJobSpec.model_validate({**base, "trainer": {"totalSteps": 99}})
    other_model = RLJobSpec.model_validate({**base, "model": {"path": TINY + "&x=1"}})
    assert ckpt.resume_fields_hash(spec) == ckpt.resume_fields_hash(more_steps)
    assert ckpt.resume_fields_hash(spec) != ckpt.resume_fields_hash(other_model)
    default_shape = RLJobSpec.model_validate({**base, "model": {"path": TINY, "shape": spec.model.shape}})
    assert ckpt.resume_fields_hash(spec) == ckpt.resume_fields_hash(default_shape)  # a new field at its default
    more_samples = RLJobSpec.model_validate({**base, "batch": {"rolloutN": spec.batch.rollout_n + 1}})
    assert ckpt.resume_fields_hash(spec) != ckpt.resume_fields_hash(more_samples)


WRITER = """
import sys, time
from pathlib import Path
from kuberl.trainer.checkpoint import files as ckpt
root, step = Path(sys.argv[1]), int(sys.argv[2])
folder = ckpt.prepare(root, step)
def slow(f):
    for _ in range(10_000):
        f.write(b"x" * 65536)
        f.flush()
        time.sleep(0.001)
print("writing", flush=True)
ckpt.write_atomic(folder / "actor" / "model" / "__0_0.distcp", slow)
ckpt.write_state(folder, {"step": step}, roles=("actor",))
ckpt.mark_latest(root, folder)
"""


@pytest.mark.timeout(120)
def test_kill_9_during_a_checkpoint_write_resumes_from_the_previous_complete_one(tmp_path):
    previous = make_checkpoint(tmp_path, 4)
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), "6"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    partial = tmp_path / "global_step_6" / "actor" / "model" / "__0_0.distcp.partial"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 1 << 20):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "global_step_6").exists()
    assert ckpt.resolve_resume("auto", tmp_path) == previous
    assert not (tmp_path / "global_step_6").exists()


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    ckpt.save_rng(tmp_path / "rng.pt")
    expected = (torch.rand(3), random.random(), np.random.rand())
    ckpt.load_rng(tmp_path / "rng.pt")
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


# --- rank-count independence ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(rank: int, world: int, port: int):
    import torch.distributed as dist

    from kuberl.trainer.model import fsdp
    from kuberl.trainer.model.loading import load_causal_lm

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

    from kuberl.trainer.model import fsdp

    model, optimizer, scheduler = build(rank, world, port)
    ids = torch.arange(12).reshape(2, 6) + 4 * rank
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    shards.save_sharded(folder, rank=rank, model=model, optimizer=optimizer, scheduler=scheduler)
    full = dict(fsdp.full_named_parameters(model))
    exp_avg = {
        name: fsdp.full_tensor(optimizer.state[p]["exp_avg"]).clone()
        for name, p in model.named_parameters()
        if p in optimizer.state
    }
    if rank == 0:
        torch.save({"params": full, "lr": optimizer.param_groups[0]["lr"], "exp_avg": exp_avg}, out)
    dist.destroy_process_group()


def load_and_step(rank: int, world: int, port: int, folder: str, out: str) -> None:
    import torch.distributed as dist

    from kuberl.trainer.model import fsdp

    model, optimizer, scheduler = build(rank, world, port)
    shards.load_sharded(folder, rank=rank, model=model, optimizer=optimizer, scheduler=scheduler)
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
    assert sorted(os.listdir(folder)) == ["model", "optim", "rng_rank0.pt", "rng_rank1.pt", "scheduler.json"]
    assert sorted(os.listdir(folder / "model")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one shard per rank
    spawn(load_and_step, 1, str(folder), loaded)
    before, after = torch.load(saved), torch.load(loaded)
    assert before["params"].keys() == after["params"].keys()
    for name in before["params"]:
        torch.testing.assert_close(after["params"][name], before["params"][name], rtol=0, atol=0)
    assert after["lr"] == pytest.approx(before["lr"])
    assert any(torch.count_nonzero(v) for v in after["exp_avg"].values())
    for name, value in after["exp_avg"].items():
        torch.testing.assert_close(value, before["exp_avg"][name], rtol=0, atol=0)
    export = shards.load_full_model_state(folder)
    for name in before["params"]:
        torch.testing.assert_close(export[name], before["params"][name], rtol=0, atol=0)


# --- completeness: the manifest must list a whole checkpoint ---------------------------------------------------


def test_a_sealed_checkpoint_whose_manifest_lacks_the_model_is_incomplete_and_resume_falls_back(tmp_path):
    # issue 38: a save whose unfinished folder another trainer deleted under it was sealed with a consistent
    # manifest and no model; every resume then crashed on it and the intact earlier checkpoint was never tried
    previous = make_checkpoint(tmp_path, 1)
    folder = ckpt.prepare(tmp_path, 2)
    ckpt.write_state(folder, {"step": 2}, roles=("actor",))
    reason = ckpt.verify(folder)
    assert reason is not None and "lists no actor/model/.metadata, actor/optim/.metadata" in reason
    damaged: list[ckpt.Damaged] = []
    assert ckpt.resolve_resume("auto", tmp_path, damaged=damaged) == previous
    assert [d.folder for d in damaged] == [folder]


def test_every_role_of_the_manifest_must_be_complete(tmp_path):
    folder = ckpt.prepare(tmp_path, 3)
    ckpt.write_atomic(folder / "actor" / "model" / "__0_0.distcp", lambda f: f.write(b"x"))
    seal(folder, 3)  # the actor's files only
    manifest = ckpt.read_manifest(folder)
    manifest["roles"] = ["actor", "critic"]
    ckpt.write_json(folder / ckpt.MANIFEST, manifest)
    assert "lists no critic/model/.metadata" in (ckpt.verify(folder) or "")


# --- one run per folder: the owner lock --------------------------------------------------------------------------

HOLDER = """
import sys, time
from kuberl.trainer.checkpoint import folder as ckpt_folder
owner = ckpt_folder.Owner(uid="uid-a", rljob="first", run_id="run-1", host="here", pid=int(sys.argv[2]), since="then")
lock = ckpt_folder.take_folder(sys.argv[1], owner, wait_seconds=0)
print("held", flush=True)
time.sleep(600)
"""


def owner(uid: str | None = "uid-a", run_id: str = "run-2") -> ckpt_folder.Owner:
    return ckpt_folder.Owner(uid=uid, rljob="job", run_id=run_id, host="here", pid=os.getpid(), since="now")


@pytest.mark.timeout(120)
def test_a_held_folder_is_refused_naming_the_holder_until_the_holder_is_killed(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), "4242"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        unfinished = ckpt.step_dir(tmp_path, 7)
        unfinished.mkdir()  # the holder's save in progress: the refused run must not delete it
        with pytest.raises(
            ckpt_folder.CheckpointFolderInUse, match=r"in use by run run-1 of RLJob first \(uid uid-a, pid 4242"
        ):
            ckpt_folder.take_folder(tmp_path, owner(), wait_seconds=1)
        assert unfinished.is_dir()
        holder.send_signal(signal.SIGKILL)  # the kernel drops a dead process's lock
        holder.wait(timeout=30)
        lock = ckpt_folder.take_folder(tmp_path, owner(), wait_seconds=5)
        assert json.loads((tmp_path / ckpt_folder.OWNER).read_text())["run_id"] == "run-2"
        lock.release()
    finally:
        holder.kill()


def test_another_rljobs_folder_is_refused_before_anything_in_it_is_deleted(tmp_path):
    make_checkpoint(tmp_path, 2, ckpt.Identity(uid="uid-a", spec_hash="h"))  # written before owner.json existed
    unfinished = ckpt.step_dir(tmp_path, 3)
    unfinished.mkdir()
    with pytest.raises(ckpt_folder.CheckpointFolderInUse, match=r"holds the checkpoints of .*uid uid-a.*global_step_2"):
        ckpt_folder.take_folder(tmp_path, owner(uid="uid-b"), wait_seconds=0)
    assert unfinished.is_dir() and not (tmp_path / ckpt_folder.OWNER).exists()
    ckpt_folder.take_folder(tmp_path, owner(uid="uid-b"), wait_seconds=0, adopt=True).release()  # trainer.resume asked
    assert json.loads((tmp_path / ckpt_folder.OWNER).read_text())["uid"] == "uid-b"


def test_a_pinned_resume_path_is_used_once_then_the_jobs_own_newer_checkpoint(tmp_path):
    pinned = make_checkpoint(tmp_path / "old-job", 4, ckpt.Identity(uid="uid-old", spec_hash="h"))
    mine, identity = tmp_path / "mine", ckpt.Identity(uid="uid-new", spec_hash="h")
    assert ckpt.resolve_resume(str(pinned), mine, identity) == pinned  # the first attempt starts there
    own = make_checkpoint(mine, 6, identity)  # ... and saves; a retry continues from its own, not from step 4
    assert ckpt.resolve_resume(str(pinned), mine, identity) == own
    other = make_checkpoint(tmp_path / "third", 9, ckpt.Identity(uid="uid-x", spec_hash="h"))
    assert ckpt.resolve_resume(str(pinned), other.parent, identity) == pinned  # not this job's: the path wins


# --- storage: real small and read-only filesystems ---------------------------------------------------------------


def test_a_read_only_folder_is_refused_before_training_naming_it(small_filesystem):
    root = small_filesystem("1m", read_only=True)
    with pytest.raises(
        ckpt_folder.CheckpointStorageError, match=r"checkpointDir .*/fs0/ckpt cannot be written: Read-only"
    ):
        ckpt_folder.take_folder(root / "ckpt", owner(), wait_seconds=0)


def test_the_preflight_wants_room_for_the_kept_checkpoints_and_the_next(small_filesystem):
    root = small_filesystem("1m")
    assert ckpt_folder.storage_problem(root, 200 * 1024, keep=3) is None  # 4 × 200 KiB fit in 1 MiB
    problem = ckpt_folder.storage_problem(root, 300 * 1024, keep=3)
    assert problem is not None and "need 1.2 MiB more at ~300.0 KiB per checkpoint" in problem
    assert "trainer.maxCheckpoints = 3 kept (0 here now)" in problem and "storage.claim.size" in problem
