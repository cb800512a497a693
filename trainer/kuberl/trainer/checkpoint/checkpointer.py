"""A run's checkpoints from the driver's side, in the folder the run holds
(:class:`~kuberl.trainer.checkpoint.folder.CheckpointFolder`): the checkpoint ``trainer.resume`` asks for is found
before Ray starts (:func:`select_resume`); a resume checks that the storage holds the checkpoints the run keeps and
restores all of that checkpoint; a save has the worker
groups write their shards (:mod:`~kuberl.trainer.checkpoint.shards`), writes the driver's state (step, data order,
KL controller, RNG) under ``trainer.checkpointDir`` and marks it latest. The files themselves are
:mod:`kuberl.trainer.checkpoint.files`'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kuberl.api import RLJobSpec
from kuberl.trainer.algorithms.kl import KLController
from kuberl.trainer.checkpoint import files as ckpt
from kuberl.trainer.checkpoint.folder import (
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    CheckpointFolder,
    CheckpointStorageError,
    checkpoint_size,
    storage_problem,
)
from kuberl.trainer.data.prompts import PromptLoader
from kuberl.trainer.observe.reporting import Reporting, write


class Group(Protocol):
    """A worker group whose ranks save and load their shards (:class:`kuberl.trainer.workers.group.WorkerGroup`)."""

    def call(self, method: str, *args: Any) -> Any: ...


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run starts from (None: a fresh start) and the driver's state saved with it."""

    folder: Path | None
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"]) if self.folder is not None else 0


def select_resume(spec: RLJobSpec, folder: CheckpointFolder, reporting: Reporting) -> ResumePoint:
    """The checkpoint ``trainer.resume`` selects, chosen before Ray starts: a checkpoint the spec refuses (another
    job's, a changed batch) fails the run before any worker loads a model, and a run already at its last step
    starts none. Each damaged checkpoint skipped is a warning. The folder must be taken: this deletes unfinished
    checkpoints."""
    assert folder.lock is not None, "CheckpointFolder.take first: resuming deletes unfinished checkpoints"
    damaged: list[ckpt.Damaged] = []
    found = ckpt.resolve_resume(spec.trainer.resume, folder.path, folder.identity, damaged)
    for skipped in damaged:
        reporting.warn("CheckpointDamaged", f"checkpoint {skipped.folder} is damaged and was skipped: {skipped.reason}")
    return ResumePoint(found, ckpt.read_state(found) if found is not None else {})


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
        return (WEIGHT_BYTES * params + OPTIMIZER_BYTES * trained) * len(self.roles)

    def resume(self, start: ResumePoint) -> None:
        """Check that the storage holds the checkpoints the run keeps, then restore ``start`` (if any) into the
        workers and the driver."""
        self.folder.check_room(self.estimated_size())
        if start.folder is None:
            return
        for role, group in self.roles:
            group.call("load_checkpoint", str(start.folder / role), start.step)
        self.loader.load_state_dict(start.state["dataloader"])
        self.kl_ctrl.load_state_dict(start.state["kl_controller"])
        self.last = str(start.folder)
        ckpt.restore_driver_rng(start.folder)
        write(f"resumed from {start.folder} at step {start.step}")

    def save(self, step: int, *, dataloader: dict[str, Any] | None = None) -> str:
        """``dataloader``: the loader position to resume at, when it is not the loader's own (a batch drawn and
        generated ahead of its step, not trained yet, is drawn and generated again after a resume; asynchronous
        training adds the prompts after it trained already)."""
        position = dataloader if dataloader is not None else self.loader.state_dict()
        try:
            return self._save(step, position)
        except Exception as exc:  # a full or unwritable volume fails every retry the same way: say so
            problem = storage_problem(self.checkpoint_dir, checkpoint_size(self.checkpoint_dir) or 1)
            if problem is None:
                raise
            raise CheckpointStorageError(f"saving the checkpoint of step {step} failed: {problem}") from exc

    def _save(self, step: int, position: dict[str, Any]) -> str:
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
