"""One run holds its checkpoint folder (``trainer.checkpointDir``) at a time, and the folder must take the
checkpoints the run keeps.

:func:`take_folder` locks ``owner.lock`` (a ``fcntl`` POSIX lock: released when the process ends however it ends,
and honoured over NFSv4) before anything in the folder is deleted or written, records the holder in ``owner.json``,
and refuses a folder another RLJob's checkpoints are in. :func:`storage_problem` is the storage preflight: a probe
write, and room for the checkpoints kept plus the next. :class:`CheckpointFolder` is what the driver holds for the
run (taken before Ray starts, so that a folder the run cannot own or write fails at once)."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import shutil
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kuberl.api import RLJobSpec
from kuberl.api.contract import ENV_RLJOB_UID, timestamp
from kuberl.trainer.checkpoint.files import (
    CheckpointMismatch,
    Identity,
    find_latest,
    list_checkpoints,
    read_manifest,
    read_state,
    resume_fields_hash,
    write_atomic,
    write_json,
)

log = logging.getLogger(__name__)

OWNER = "owner.json"
OWNER_LOCK = "owner.lock"
# Bytes a checkpoint takes per parameter: fp32 weights, and Adam's two fp32 moments for a trained one (docs/storage.md
# has the measurement). The storage preflight sizes checkpoints with them until one exists.
WEIGHT_BYTES = 4
OPTIMIZER_BYTES = 8


class CheckpointFolderInUse(CheckpointMismatch):
    """Another run holds the checkpoint folder's lock, or another RLJob's checkpoints are in it."""


class CheckpointStorageError(RuntimeError):
    """The checkpoint folder cannot be written, or cannot hold the checkpoints the run will keep."""


@dataclass(frozen=True)
class Owner:
    """Who holds a checkpoint folder: the RLJob (``uid`` None outside Kubernetes) and this run of it."""

    uid: str | None
    rljob: str
    run_id: str
    host: str = ""
    pid: int = 0
    since: str = ""

    def describe(self) -> str:
        where = f", pid {self.pid} on {self.host} since {self.since}" if self.pid else ""
        return f"run {self.run_id or '?'} of RLJob {self.rljob or '?'} (uid {self.uid or 'none: a local run'}{where})"


class FolderLock:
    """A run's hold on its checkpoint folder (the lock on ``owner.lock``): until :meth:`release` or the process
    ends, however it ends (the kernel, or the NFS server, drops a dead process's lock)."""

    def __init__(self, fd: int, folder: Path) -> None:
        self.fd: int | None = fd
        self.folder = folder

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the file drops its POSIX lock
            self.fd = None


def read_owner(checkpoint_dir: Path) -> Owner | None:
    """The folder's recorded owner: ``owner.json``, or for a folder written before it existed the uid in its
    newest manifest; None for a folder no run has used."""
    try:
        recorded = json.loads((checkpoint_dir / OWNER).read_text())
        return Owner(**{k: recorded.get(k) for k in Owner.__dataclass_fields__})
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError) as exc:
        log.warning("%s unreadable (%s): judging the folder by its checkpoints", checkpoint_dir / OWNER, exc)
    sealed = list_checkpoints(checkpoint_dir)
    if not sealed:
        return None
    try:
        uid = read_manifest(sealed[-1][1]).get("uid")
    except (OSError, ValueError):
        return None
    return Owner(uid=uid, rljob=str(read_state_or_empty(sealed[-1][1]).get("rljob") or ""), run_id="")


def read_state_or_empty(folder: Path) -> dict[str, Any]:
    try:
        return read_state(folder)
    except (OSError, ValueError):
        return {}


def take_folder(checkpoint_dir: str | Path, owner: Owner, *, wait_seconds: float, adopt: bool = False) -> FolderLock:
    """Lock ``checkpoint_dir`` for ``owner`` before anything in it is deleted or written, and record the owner.

    Another run holding the lock (a second trainer on the folder, or the previous attempt still saving after a stop)
    is waited for up to ``wait_seconds``, then refused naming it. A folder whose checkpoints are another RLJob's is
    refused unless ``adopt`` (``trainer.resume`` names a checkpoint in it: starting from it was asked for).
    Raises :class:`CheckpointFolderInUse`, or :class:`CheckpointStorageError` when the folder cannot be made."""
    root = Path(checkpoint_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise CheckpointStorageError(unwritable(root, exc)) from exc
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise CheckpointStorageError(unwritable(root, exc)) from exc
            if time.monotonic() >= deadline:
                os.close(fd)
                holder = read_owner(root)
                raise CheckpointFolderInUse(
                    f"trainer.checkpointDir {root} is in use by "
                    f"{holder.describe() if holder else 'another process'} (waited {wait_seconds:g} s for it): two "
                    "trainers in one folder delete each other's unfinished checkpoints; stop the other run, or give "
                    "this one its own trainer.checkpointDir"
                ) from None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    lock = FolderLock(fd, root)
    previous = read_owner(root)
    if previous is not None and previous.uid != owner.uid and not adopt:
        lock.release()
        newest = find_latest(root)
        raise CheckpointFolderInUse(
            f"trainer.checkpointDir {root} holds the checkpoints of {previous.describe()}, not of this RLJob (uid "
            f"{owner.uid or 'none: a local run'}): a run deletes unfinished and old checkpoints in its folder, so "
            "it does not take another job's; give this RLJob its own checkpointDir (on a claim a relative one is "
            "per RLJob), or set trainer.resume to one of its global_step_N folders to start from it"
            + (f" (the newest is {newest})" if newest else "")
        )
    try:
        write_json(root / OWNER, asdict(owner))
    except OSError as exc:
        lock.release()
        raise CheckpointStorageError(unwritable(root, exc)) from exc
    return lock


def size_text(num_bytes: float) -> str:
    """``num_bytes`` for people: 312.5 KiB, 5.6 GiB."""
    if num_bytes < 1024:
        return f"{int(num_bytes)} B"
    units = ("KiB", "MiB", "GiB")
    power = min(len(units), int(math.log(num_bytes, 1024)))
    return f"{num_bytes / 1024**power:.1f} {units[power - 1]}"


FULL_HINT = "give the claim more space (storage.claim.size), lower trainer.maxCheckpoints, or delete old checkpoints"


def unwritable(root: Path, exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"trainer.checkpointDir {root} is full ({exc.strerror}): {FULL_HINT}"
    return (
        f"trainer.checkpointDir {root} cannot be written: {exc.strerror or exc} ({exc.filename or root}); mount a "
        "writable volume there (storage.claim, or a cluster.volumes entry that is not read-only) or choose another "
        "checkpointDir"
    )


def checkpoint_size(checkpoint_dir: Path) -> int | None:
    """Bytes of one checkpoint as the newest sealed one in ``checkpoint_dir`` measures; None when there is none."""
    for _, folder in reversed(list_checkpoints(checkpoint_dir)):
        try:
            return sum(int(f["size"]) for f in read_manifest(folder)["files"].values())
        except (OSError, ValueError, KeyError):
            continue
    return None


def storage_problem(checkpoint_dir: str | Path, checkpoint_bytes: int, *, keep: int = 0) -> str | None:
    """What keeps ``checkpoint_dir`` from taking the next checkpoint (and, with ``keep``, the ``keep`` it keeps
    meanwhile: the newest is written before rotation deletes the oldest); None when nothing does. Writes and
    deletes a probe file."""
    root = Path(checkpoint_dir)
    probe = root / f".write-probe-{os.getpid()}"
    try:
        write_atomic(probe, lambda f: f.write(bytes(4096)))
        probe.unlink()
    except OSError as exc:
        return unwritable(root, exc)
    held = len(list_checkpoints(root))
    needed = max(1, keep + 1 - held) * checkpoint_bytes
    free = shutil.disk_usage(root).free
    if free >= needed:
        return None
    kept = f"trainer.maxCheckpoints = {keep} kept ({held} here now) and the next" if keep else "the next checkpoint"
    return (
        f"trainer.checkpointDir {root} has {size_text(free)} free, but {kept} need {size_text(needed)} more at "
        f"~{size_text(checkpoint_bytes)} per checkpoint: {FULL_HINT}"
    )


class CheckpointFolder:
    """``trainer.checkpointDir`` held by one run: the owner lock, taken before anything there is deleted or written
    (and before Ray starts, so that a folder this run cannot own or write fails at once), and the storage checks."""

    def __init__(self, spec: RLJobSpec, *, rljob: str) -> None:
        self.spec = spec
        self.rljob = rljob
        self.path = Path(spec.trainer.checkpoint_dir)
        self.run_id = uuid.uuid4().hex[:12]
        self.lock: FolderLock | None = None

    @property
    def identity(self) -> Identity:
        """What this run's checkpoints record and what auto-resume requires: the RLJob uid (the operator sets it) and
        the hash of model/data/algorithm/batch."""
        return Identity(os.environ.get(ENV_RLJOB_UID) or None, resume_fields_hash(self.spec))

    def take(self) -> None:
        """Lock the folder for this run and check that it can be written; raises what a retry would meet again
        (:mod:`kuberl.trainer.driver.failures`: permanent). Another run's hold is waited for up to
        runPolicy.terminationGracePeriodSeconds: how long a stopped attempt may still be saving."""
        resume = self.spec.trainer.resume
        named = Path(resume).expanduser().resolve()
        adopt = resume not in ("auto", "disable") and named.parent == self.path.resolve()
        owner = Owner(
            uid=self.identity.uid,
            rljob=self.rljob,
            run_id=self.run_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            since=timestamp(),
        )
        wait = float(self.spec.run_policy.termination_grace_period_seconds)
        self.lock = take_folder(self.path, owner, wait_seconds=wait, adopt=adopt)
        problem = storage_problem(self.path, 0)
        if problem is not None:
            raise CheckpointStorageError(problem)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def check_room(self, estimated_size: int) -> None:
        """The storage preflight, before step 1: room for trainer.maxCheckpoints checkpoints and the next, each the
        size of the newest checkpoint there (``estimated_size`` before one exists)."""
        size = checkpoint_size(self.path) or estimated_size
        problem = storage_problem(self.path, size, keep=self.spec.trainer.max_checkpoints or 0)
        if problem is not None:
            raise CheckpointStorageError(problem)
