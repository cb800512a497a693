"""A run's checkpoints from the driver's side: the run first takes its folder (:class:`CheckpointFolder`, the owner
lock) and checks that it can be written; a resume checks that the storage holds the checkpoints the run keeps, then finds the checkpoint
``trainer.resume`` asks for and restores all of it; a save writes the worker groups' shards and the driver's state
(step, data order, KL controller, RNG) under ``trainer.checkpointDir`` and marks it latest. The files themselves
are :mod:`kuberl.trainer.checkpoint.files`'s."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from kuberl.api import RLJobSpec
from kuberl.api.contract import ENV_RLJOB_UID, timestamp
from kuberl.trainer.algorithms.kl import KLController
from kuberl.trainer.checkpoint import files as ckpt
from kuberl.trainer.data.prompts import PromptLoader
from kuberl.trainer.observe.reporting import Reporting, write


class Group(Protocol):
    """A worker group whose ranks save and load their shards (:class:`kuberl.trainer.workers.group.WorkerGroup`)."""

    def call(self, method: str, *args: Any) -> Any: ...


class CheckpointFolder:
    """``trainer.checkpointDir`` held by one run: the owner lock, taken before anything there is deleted or written
    (and before Ray starts, so that a folder this run cannot own or write fails at once), and the storage checks."""

    def __init__(self, spec: RLJobSpec, *, rljob: str) -> None:
        self.spec = spec
        self.rljob = rljob
        self.path = Path(spec.trainer.checkpoint_dir)
        self.run_id = uuid.uuid4().hex[:12]
        self.lock: ckpt.FolderLock | None = None

    @property
    def identity(self) -> ckpt.Identity:
        """What this run's checkpoints record and what auto-resume requires: the RLJob uid (the operator sets it) and
        the hash of model/data/algorithm/batch."""
        return ckpt.Identity(os.environ.get(ENV_RLJOB_UID) or None, ckpt.resume_fields_hash(self.spec))

    def take(self) -> None:
        """Lock the folder for this run and check that it can be written; raises what a retry would meet again
        (:mod:`kuberl.trainer.driver.failures`: permanent). Another run's hold is waited for up to
        runPolicy.terminationGracePeriodSeconds: how long a stopped attempt may still be saving."""
        resume = self.spec.trainer.resume
        named = Path(resume).expanduser().resolve()
        adopt = resume not in ("auto", "disable") and named.parent == self.path.resolve()
        owner = ckpt.Owner(
            uid=self.identity.uid,
            rljob=self.rljob,
            run_id=self.run_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            since=timestamp(),
        )
        wait = float(self.spec.run_policy.termination_grace_period_seconds)
        self.lock = ckpt.take_folder(self.path, owner, wait_seconds=wait, adopt=adopt)
        problem = ckpt.storage_problem(self.path, 0)
        if problem is not None:
            raise ckpt.CheckpointStorageError(problem)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def check_room(self, estimated_size: int) -> None:
        """The storage preflight, before step 1: room for trainer.maxCheckpoints checkpoints and the next, each the
        size of the newest checkpoint there (``estimated_size`` before one exists)."""
        size = ckpt.checkpoint_size(self.path) or estimated_size
        problem = ckpt.storage_problem(self.path, size, keep=self.spec.trainer.max_checkpoints or 0)
        if problem is not None:
            raise ckpt.CheckpointStorageError(problem)


class Checkpointer:
    """Saves and resumes one run in its taken :class:`CheckpointFolder`; :attr:`last` is what the RLJob status and
    the closing line report."""

    def __init__(
        self,
        spec: RLJobSpec,
        *,
        folder: CheckpointFolder,
        roles: Sequence[tuple[str, Group]],
        ranks: int,
        params: tuple[int, int],
        loader: PromptLoader,
        kl_ctrl: KLController,
        total_steps: int,
        reporting: Reporting,
    ) -> None:
        self.spec = spec
        self.folder = folder
        self.roles = roles
        """The worker groups whose state a checkpoint holds, by folder name."""
        self.ranks = ranks
        self.params = params
        """The policy's parameters, and of them the trained ones."""
        self.loader = loader
        self.kl_ctrl = kl_ctrl
        self.total_steps = total_steps
        self.reporting = reporting
        self.last: str | None = None
        """The folder of the newest checkpoint this run saved or resumed from."""

    @property
    def checkpoint_dir(self) -> Path:
        return self.folder.path

    def estimated_size(self) -> int:
        """Bytes of one checkpoint before one exists: each role's weights and its trained parameters' Adam moments
        (the critic shares the policy's trunk)."""
        params, trained = self.params
        return (ckpt.WEIGHT_BYTES * params + ckpt.OPTIMIZER_BYTES * trained) * len(self.roles)

    def resume(self) -> int:
        """Check the storage, then restore the checkpoint ``trainer.resume`` selects; the step it was saved at, 0
        when there is none. The folder must be taken: resuming deletes unfinished checkpoints."""
        assert self.folder.lock is not None, "CheckpointFolder.take first: resuming deletes unfinished checkpoints"
        self.folder.check_room(self.estimated_size())
        damaged: list[ckpt.Damaged] = []
        folder = ckpt.resolve_resume(self.spec.trainer.resume, self.checkpoint_dir, self.folder.identity, damaged)
        for skipped in damaged:
            self.reporting.warn(
                "CheckpointDamaged", f"checkpoint {skipped.folder} is damaged and was skipped: {skipped.reason}"
            )
        if folder is None:
            return 0
        state = ckpt.read_state(folder)
        step = int(state["step"])
        for role, group in self.roles:
            group.call("load_checkpoint", str(folder / role), step)
        self.loader.load_state_dict(state["dataloader"])
        self.kl_ctrl.load_state_dict(state["kl_controller"])
        self.last = str(folder)
        ckpt.restore_driver_rng(folder)
        write(f"resumed from {folder} at step {step}")
        return step

    def save(self, step: int, *, dataloader: dict[str, int] | None = None) -> str:
        """``dataloader``: the loader position to resume at, when it is not the loader's own (a batch drawn and
        generated ahead of its step, not trained yet, is drawn and generated again after a resume)."""
        position = dataloader if dataloader is not None else self.loader.state_dict()
        try:
            return self._save(step, position)
        except Exception as exc:  # a full or unwritable volume fails every retry the same way: say so
            problem = ckpt.storage_problem(self.checkpoint_dir, ckpt.checkpoint_size(self.checkpoint_dir) or 1)
            if problem is None:
                raise
            raise ckpt.CheckpointStorageError(f"saving the checkpoint of step {step} failed: {problem}") from exc

    def _save(self, step: int, position: dict[str, int]) -> str:
        folder = ckpt.prepare(self.checkpoint_dir, step)
        for role, group in self.roles:
            group.call("save_checkpoint", str(folder / role))
        ckpt.write_state(
            folder,
            {
                "step": step,
                "epoch": position["epoch"],
                "rljob": self.folder.rljob,
                "dataloader": position,
                "kl_controller": self.kl_ctrl.state_dict(),
                "total_steps": self.total_steps,
                "trainer_ranks": self.ranks,
            },
            self.folder.identity,
            roles=tuple(role for role, _ in self.roles),
        )
        ckpt.mark_latest(self.checkpoint_dir, folder)
        ckpt.rotate(self.checkpoint_dir, self.spec.trainer.max_checkpoints)
        self.last = str(folder)
        return str(folder)
