"""Checkpoints that survive a crash mid-write, are verified before resume, and load on any number of ranks.

Layout under ``trainer.checkpointDir``::

    latest                      "global_step_N": the newest sealed checkpoint (a hint; resume verifies)
    global_step_N/
      manifest.json             written LAST: every other file's size and sha256, the step, the resume identity
      trainer_state.json        step, epoch, dataloader position, KL controller, metrics of the step
      driver_rng.pt             the driver's Python / NumPy / torch RNG states (tensors and numbers only)
      actor/ model/             torch.distributed.checkpoint: each rank writes its own shards, in parallel
             optim/             the same for the optimizer (keyed by parameter name)
             scheduler.json     learning-rate scheduler
             rng_rank{r}.pt     each rank's RNG (sampling), restored when that rank exists again
             hf/                config and tokenizer, so ``kuberl export`` needs nothing else
      critic/ …                 the same for the critic (gae)

and beside the step folders ``owner.json`` (the RLJob uid and run that own the folder) and ``owner.lock``.

One run owns a folder at a time (:mod:`kuberl.trainer.checkpoint.folder`: the lock on ``owner.lock``, taken before
anything in the folder is deleted or written; a folder with another RLJob's checkpoints is refused). Writes are
atomic: a file goes to a temporary name, is fsynced and renamed; a DCP folder is written under a temporary name and
renamed once every rank has finished. A checkpoint without ``manifest.json`` is incomplete (the writer died): resume
deletes it. A checkpoint is complete only when its manifest lists every file of a checkpoint (the driver's state and
RNG; each role's model, optimizer and scheduler) and every listed file matches; resume takes the newest complete one
and falls back to the previous one (reported to the caller, which tells the user) when the newest is not. Rotation
never deletes the newest checkpoint that verifies. Nothing is loaded with ``weights_only=False``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

LATEST = "latest"
MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.json"
DRIVER_RNG = "driver_rng.pt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
PARTIAL = ".partial"  # suffix of a file or DCP folder being written
MANIFEST_VERSION = 2  # 2: the manifest names its roles; version 1 had the actor only
HASH_CHUNK = 1 << 20
RESUME_FIELDS = ("model", "data", "algorithm", "batch")  # spec fields a resumed run must share with the saved one
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a folder's shards, written last
ROLE_FILES = (f"model/{DCP_METADATA}", f"optim/{DCP_METADATA}", "scheduler.json")
"""What every role (actor, critic) of a complete checkpoint holds, besides the shards the metadata indexes."""


class CheckpointMismatch(ValueError):
    """The checkpoints in checkpointDir belong to another RLJob or to a different spec: resuming would be wrong."""


@dataclass(frozen=True)
class Identity:
    """What a checkpoint must match to be resumed automatically: the RLJob's uid and the hash of the fields that
    define the run (``resume_fields_hash``). ``uid`` is None outside Kubernetes (no RLJob object)."""

    uid: str | None
    spec_hash: str


@dataclass(frozen=True)
class Damaged:
    """A sealed checkpoint that failed verification and was skipped."""

    folder: Path
    reason: str


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"global_step_{step}"


def resume_fields_hash(spec: Any) -> str:
    """sha256 of the spec fields a resumed run must share with the run that saved: model, data, algorithm, batch.
    Fields at their defaults are left out, so a release that adds a field with a default (model.shape did) keeps
    the checkpoints of jobs that do not set it resumable across the upgrade."""
    fields = {
        name: getattr(spec, name).model_dump(mode="json", by_alias=True, exclude_defaults=True)
        for name in RESUME_FIELDS
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


# --- atomic files -----------------------------------------------------------------------------------------------


def fsync_dir(folder: Path) -> None:
    """Persist the directory entry of a rename or a new file (a file's fsync does not cover its name)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[Any], None], *, binary: bool = True) -> None:
    """Write through ``write(file)`` to ``path.partial``, fsync, rename to ``path``, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + PARTIAL)
    with open(tmp, "wb" if binary else "w") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, lambda f: json.dump(data, f, indent=2, sort_keys=True), binary=False)


def fsync_tree(folder: Path) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


def publish_dir(tmp: Path, final: Path) -> None:
    """Fsync everything under ``tmp`` and rename it to ``final`` (replacing a leftover of an earlier attempt)."""
    fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)


# --- RNG states as tensors and numbers (loadable with weights_only=True) ----------------------------------------


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_rng(path: Path) -> None:
    state = rng_state()
    write_atomic(path, lambda f: torch.save(state, f))


def load_rng(path: Path) -> None:
    set_rng_state(torch.load(path, map_location="cpu", weights_only=True))


# --- sealing (the driver) --------------------------------------------------------------------------------------


def prepare(checkpoint_dir: str | Path, step: int) -> Path:
    """An empty ``global_step_N`` for a new save (a leftover of an earlier attempt at this step is removed)."""
    folder = step_dir(checkpoint_dir, step)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            yield path


def write_state(
    folder: Path, state: dict[str, Any], identity: Identity | None = None, *, roles: tuple[str, ...]
) -> None:
    """Seal a checkpoint: the driver's state and RNG, then the manifest of every file (sizes, sha256, identity) and
    of the ``roles`` whose state it must hold. Call it after every worker has saved; the manifest is the last write
    and marks the checkpoint complete."""
    write_json(folder / STATE_FILE, state)
    save_rng(folder / DRIVER_RNG)
    fsync_tree(folder)
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256(p)} for p in checkpoint_files(folder)
    }
    manifest = {
        "version": MANIFEST_VERSION,
        "step": state.get("step"),
        "uid": identity.uid if identity else None,
        "specHash": identity.spec_hash if identity else None,
        "roles": list(roles),
        "files": files,
    }
    write_json(folder / MANIFEST, manifest)


def mark_latest(checkpoint_dir: str | Path, folder: Path) -> None:
    write_atomic(Path(checkpoint_dir) / LATEST, lambda f: f.write(folder.name + "\n"), binary=False)


# --- reading and resolving (the driver) ------------------------------------------------------------------------


def is_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def read_manifest(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / MANIFEST).read_text())
    return data


def read_state(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / STATE_FILE).read_text())
    return data


def restore_driver_rng(folder: Path) -> None:
    load_rng(folder / DRIVER_RNG)


def required_files(manifest: dict[str, Any]) -> list[str]:
    """The files a complete checkpoint's manifest must list: the driver's, and each of its roles' (the actor's
    alone before manifest version 2)."""
    roles = manifest.get("roles") or ["actor"]
    return [STATE_FILE, DRIVER_RNG, *(f"{role}/{name}" for role in roles for name in ROLE_FILES)]


def verify(folder: Path) -> str | None:
    """None when the manifest lists every file of a complete checkpoint and each is there with its size and hash;
    else what is wrong. (A manifest can be consistent yet lack the model: a save whose unfinished folder another
    process deleted under it.)"""
    try:
        manifest = read_manifest(folder)
    except (OSError, ValueError) as exc:
        return f"{folder / MANIFEST} unreadable: {exc}"
    missing = [name for name in required_files(manifest) if name not in manifest.get("files", {})]
    if missing:
        return f"{folder} is incomplete: its manifest lists no {', '.join(missing)} (the save lost them)"
    for name, expected in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{path} has {size} bytes, the manifest says {expected['size']} (truncated or overwritten)"
        if sha256(path) != expected["sha256"]:
            return f"{path} does not match its sha256 in the manifest (corrupted)"
    return None


def step_folders(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """Every ``global_step_N`` folder, complete or not, oldest first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def list_checkpoints(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """Sealed (complete, not necessarily verified) checkpoints, oldest first."""
    return [(step, folder) for step, folder in step_folders(checkpoint_dir) if is_complete(folder)]


def remove_incomplete(checkpoint_dir: str | Path) -> list[Path]:
    """Delete step folders without a manifest (a writer died); call only when no save is running."""
    removed = []
    for _, folder in step_folders(checkpoint_dir):
        if not is_complete(folder):
            log.warning("removing incomplete checkpoint %s (no %s: the save did not finish)", folder, MANIFEST)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def newest_verified(checkpoint_dir: str | Path, damaged: list[Damaged] | None = None) -> Path | None:
    """The newest sealed checkpoint whose files match its manifest; damaged ones are appended to ``damaged``."""
    for _, folder in reversed(list_checkpoints(checkpoint_dir)):
        reason = verify(folder)
        if reason is None:
            return folder
        log.warning("checkpoint %s is damaged, trying the previous one: %s", folder, reason)
        if damaged is not None:
            damaged.append(Damaged(folder, reason))
    return None


def find_latest(checkpoint_dir: str | Path) -> Path | None:
    """The newest sealed checkpoint (unverified; ``kuberl export`` of a checkpointDir)."""
    found = list_checkpoints(checkpoint_dir)
    return found[-1][1] if found else None


def check_identity(folder: Path, identity: Identity) -> None:
    """Refuse a checkpoint of another RLJob or of a run with different model/data/algorithm/batch."""
    manifest = read_manifest(folder)
    uid, spec_hash = manifest.get("uid"), manifest.get("specHash")
    hint = (
        f"set trainer.resume to {folder} to start from it deliberately, or give this job its own trainer.checkpointDir"
    )
    if uid and identity.uid and uid != identity.uid:
        raise CheckpointMismatch(
            f"trainer.checkpointDir: {folder} was written by another RLJob (uid {uid}, this one is "
            f"{identity.uid}); {hint}"
        )
    if spec_hash and spec_hash != identity.spec_hash:
        raise CheckpointMismatch(
            f"trainer.checkpointDir: {folder} was written with a different spec.{'/'.join(RESUME_FIELDS)} "
            f"(these must not change across a resume); {hint}"
        )


def step_of(folder: Path) -> int:
    match = STEP_DIR.match(folder.name)
    return int(match.group(1)) if match else -1


def is_own(folder: Path, identity: Identity | None) -> bool:
    """Whether ``folder`` was saved by this RLJob with this spec (its manifest's uid and spec hash)."""
    manifest = read_manifest(folder)
    return identity is not None and (manifest.get("uid"), manifest.get("specHash")) == (
        identity.uid,
        identity.spec_hash,
    )


def resolve_resume(
    resume: str,
    checkpoint_dir: str | Path,
    identity: Identity | None = None,
    damaged: list[Damaged] | None = None,
) -> Path | None:
    """``trainer.resume``: "disable" → None; "auto" → the newest verified checkpoint of this job (incomplete
    folders removed, damaged ones skipped and listed in ``damaged``), or None; else that folder, verified, with
    no identity check (naming a path is the explicit way to start from another run's checkpoint) — unless this
    job has since saved a newer checkpoint of its own in ``checkpoint_dir`` (an earlier attempt started from the
    path): a named path is used once, a retry continues where the job got to. Call it holding the folder's lock
    (:func:`kuberl.trainer.checkpoint.folder.take_folder`): it deletes unfinished step folders."""
    if resume == "disable":
        return None
    remove_incomplete(checkpoint_dir)
    newest = newest_verified(checkpoint_dir, damaged)
    if resume == "auto":
        if newest is not None and identity is not None:
            check_identity(newest, identity)
        return newest
    folder = Path(resume).expanduser()
    if not STEP_DIR.match(folder.name):
        raise ValueError(f"trainer.resume {resume!r}: name a global_step_N folder, or use auto / disable")
    if newest is not None and step_of(newest) > step_of(folder) and is_own(newest, identity):
        log.info("trainer.resume names %s, but this job has since saved %s: resuming there", folder, newest)
        return newest
    if not is_complete(folder):
        raise FileNotFoundError(f"trainer.resume {resume!r}: no complete checkpoint there ({MANIFEST} missing)")
    reason = verify(folder)
    if reason is not None:
        raise ValueError(f"trainer.resume {resume!r}: the checkpoint is damaged: {reason}")
    return folder


def rotate(checkpoint_dir: str | Path, max_checkpoints: int | None) -> list[Path]:
    """Delete the oldest sealed checkpoints beyond ``max_checkpoints``, but never the newest one that verifies
    (if every kept one is damaged, the newest verified older one stays)."""
    if not max_checkpoints:
        return []
    found = [folder for _, folder in list_checkpoints(checkpoint_dir)]
    keep, drop = found[len(found) - max_checkpoints :], found[: max(0, len(found) - max_checkpoints)]
    if not any(verify(folder) is None for folder in reversed(keep)):
        survivor = next((folder for folder in reversed(drop) if verify(folder) is None), None)
        drop = [folder for folder in drop if folder != survivor]
    for folder in drop:
        shutil.rmtree(folder, ignore_errors=True)
    return drop
