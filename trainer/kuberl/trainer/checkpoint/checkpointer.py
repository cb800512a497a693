"""A run's checkpoints from the driver's side: the run first takes its folder (the owner lock) and checks that it
can be written; a resume checks that the storage holds the checkpoints the run keeps, then finds the checkpoint
``trainer.resume`` asks for and restores all of it; a save writes the worker groups' shards and the driver's state
(step, data order, KL controller, RNG) under ``trainer.checkpointDir`` and marks it latest. The files themselves
are :mod:`kuberl.trainer.checkpoint.files`'s."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import Any

from kuberl.api import RLJobSpec
from kuberl.api.contract import ENV_RLJOB_UID, timestamp
from kuberl.trainer.algorithms.kl import KLController
from kuberl.trainer.checkpoint import files as ckpt
from kuberl.trainer.data.prompts import PromptLoader
from kuberl.trainer.driver.cluster import Cluster
from kuberl.trainer.observe.reporting import Reporting, write


class Checkpointer:
    """Saves and resumes one run; :attr:`last` is what the RLJob status and the closing line report."""

    def __init__(
        self,
        spec: RLJobSpec,
        *,
        rljob: str,
        cluster: Cluster,
        loader: PromptLoader,
        kl_ctrl: KLController,
        total_steps: int,
        reporting: Reporting,
    ) -> None:
        self.spec = spec
        self.rljob = rljob
        self.cluster = cluster
        self.loader = loader
        self.kl_ctrl = kl_ctrl
        self.total_steps = total_steps
        self.reporting = reporting
        self.last: str | None = None
        """The folder of the newest checkpoint this run saved or resumed from."""
        self.run_id = uuid.uuid4().hex[:12]
        self.lock: ckpt.FolderLock | None = None

    def take_folder(self) -> None:
        """Lock ``trainer.checkpointDir`` for this run (before anything there is deleted or written) and check that
        it can be written; raises what a retry would meet again (:mod:`kuberl.trainer.driver.failures`: permanent). Another
        run's hold is waited for up to runPolicy.terminationGracePeriodSeconds: how long a stopped attempt may
        still be saving."""
        resume = self.spec.trainer.resume
        named = Path(resume).expanduser().resolve()
        adopt = resume not in ("auto", "disable") and named.parent == self.checkpoint_dir.resolve()
        owner = ckpt.Owner(
            uid=self.identity.uid,
            rljob=self.rljob,
            run_id=self.run_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            since=timestamp(),
        )
        wait = float(self.spec.run_policy.termination_grace_period_seconds)
        self.lock = ckpt.take_folder(self.checkpoint_dir, owner, wait_seconds=wait, adopt=adopt)
        problem = ckpt.storage_problem(self.checkpoint_dir, 0)
        if problem is not None:
            raise ckpt.CheckpointStorageError(problem)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def estimated_size(self) -> int:
        """Bytes of one checkpoint before one exists: the actor's weights and its trained parameters' Adam moments
        (twice with a critic, the same trunk)."""
        roles = 2 if self.cluster.critic is not None else 1
        params, trained = self.cluster.params
        return (ckpt.WEIGHT_BYTES * params + ckpt.OPTIMIZER_BYTES * trained) * roles

    def check_storage(self) -> None:
        """The storage preflight, before step 1: room for trainer.maxCheckpoints checkpoints and the next."""
        size = ckpt.checkpoint_size(self.checkpoint_dir) or self.estimated_size()
        problem = ckpt.storage_problem(self.checkpoint_dir, size, keep=self.spec.trainer.max_checkpoints or 0)
        if problem is not None:
            raise ckpt.CheckpointStorageError(problem)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.spec.trainer.checkpoint_dir)

    @property
    def identity(self) -> ckpt.Identity:
        """What this run's checkpoints record and what auto-resume requires: the RLJob uid (the operator sets it) and
        the hash of model/data/algorithm/batch."""
        return ckpt.Identity(os.environ.get(ENV_RLJOB_UID) or None, ckpt.resume_fields_hash(self.spec))

    def roles(self) -> list[tuple[str, Any]]:
        """The worker groups whose state a checkpoint holds, by folder name."""
        critic = self.cluster.critic
        return [("actor", self.cluster.actor)] + ([("critic", critic)] if critic is not None else [])

    def resume(self) -> int:
        """Check the storage, then restore the checkpoint ``trainer.resume`` selects; the step it was saved at, 0
        when there is none. Call it after :meth:`take_folder`."""
        assert self.lock is not None, "take_folder first: resuming deletes unfinished checkpoints"
        self.check_storage()
        damaged: list[ckpt.Damaged] = []
        folder = ckpt.resolve_resume(self.spec.trainer.resume, self.checkpoint_dir, self.identity, damaged)
        for skipped in damaged:
            self.reporting.warn(
                "CheckpointDamaged", f"checkpoint {skipped.folder} is damaged and was skipped: {skipped.reason}"
            )
        if folder is None:
            return 0
        state = ckpt.read_state(folder)
        step = int(state["step"])
        for role, group in self.roles():
            group.all("load_checkpoint", str(folder / role), step)
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
        for role, group in self.roles():
            group.all("save_checkpoint", str(folder / role))
        ckpt.write_state(
            folder,
            {
                "step": step,
                "epoch": position["epoch"],
                "rljob": self.rljob,
                "dataloader": position,
                "kl_controller": self.kl_ctrl.state_dict(),
                "total_steps": self.total_steps,
                "trainer_ranks": self.cluster.ranks,
            },
            self.identity,
            roles=tuple(role for role, _ in self.roles()),
        )
        ckpt.mark_latest(self.checkpoint_dir, folder)
        ckpt.rotate(self.checkpoint_dir, self.spec.trainer.max_checkpoints)
        self.last = str(folder)
        return str(folder)
