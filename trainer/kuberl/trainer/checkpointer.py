"""A run's checkpoints from the driver's side: a save writes the worker groups' shards and the driver's state (step,
data order, KL controller, RNG) under ``trainer.checkpointDir`` and marks it latest; a resume finds the checkpoint
``trainer.resume`` asks for and restores all of it. The files themselves are :mod:`kuberl.trainer.checkpoint`'s."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kuberl.api import RLJobSpec
from kuberl.api.contract import ENV_RLJOB_UID
from kuberl.trainer import checkpoint as ckpt
from kuberl.trainer.cluster import Cluster
from kuberl.trainer.data import PromptLoader
from kuberl.trainer.kl import KLController
from kuberl.trainer.reporting import Reporting, write


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
        """Restore the checkpoint ``trainer.resume`` selects; the step it was saved at, 0 when there is none."""
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
        )
        ckpt.mark_latest(self.checkpoint_dir, folder)
        ckpt.rotate(self.checkpoint_dir, self.spec.trainer.max_checkpoints)
        self.last = str(folder)
        return str(folder)
