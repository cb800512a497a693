"""Checkpoints that do not depend on the number of ranks, with rotation, a ``latest`` marker and resume.

Layout under ``trainer.checkpointDir``::

    latest                      "global_step_N", written last (atomic rename): the newest complete checkpoint
    global_step_N/
      trainer_state.json        step, epoch, dataloader position, KL controller, metrics of the step
      driver_rng.pt             the driver's Python / NumPy / torch RNG states
      actor/ model.pt           FULL model state dict (plain tensors, Hugging Face names; peft names with LoRA)
             optim.pt           FULL optimizer state dict, keyed by parameter name
             scheduler.pt       learning-rate scheduler
             rng_rank{r}.pt     each rank's RNG (sampling), restored when the rank count matches
             hf/                config and tokenizer, so ``kuberl export`` needs nothing else
      critic/ …                 the same for the critic (gae)

Model and optimizer go through ``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True,
cpu_offload=True``: rank 0 gathers and writes whole tensors, and on load rank 0 reads them and FSDP re-shards them
for however many ranks the new run has (``broadcast_from_rank0``). verl's checkpoints are per rank and cannot be
loaded with a different GPU count; these can.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

LATEST = "latest"
STATE_FILE = "trainer_state.json"
STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"global_step_{step}"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- worker side (called inside every rank) -------------------------------------------------------------------


def save_sharded(
    folder: str | Path, *, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> None:
    """Gather full state dicts to rank 0 and write them; every rank writes its RNG. A collective: all ranks call."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optim_state = get_optimizer_state_dict(model, optimizer, options=options)
    if rank == 0:
        torch.save(model_state, folder / "model.pt")
        torch.save(optim_state, folder / "optim.pt")
        torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    torch.save(rng_state(), folder / f"rng_rank{rank}.pt")
    if dist.is_initialized():
        dist.barrier()


def load_sharded(
    folder: str | Path,
    *,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
) -> None:
    """Rank 0 reads the full state dicts, FSDP scatters the shards; a collective: all ranks call."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    folder = Path(folder)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True)
    model_state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True) if rank == 0 else {}
    set_model_state_dict(model, model_state, options=options)
    del model_state
    if optimizer is not None:
        optim_state = torch.load(folder / "optim.pt", map_location="cpu", weights_only=False) if rank == 0 else {}
        set_optimizer_state_dict(model, optimizer, optim_state, options=options)
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
    rng_file = folder / f"rng_rank{rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    else:  # fewer ranks saved than now: a new rank gets a fresh, still deterministic, sampling stream
        log.warning("%s missing (the checkpoint was saved with fewer ranks): seeding rank %d afresh", rng_file, rank)


# --- driver side ------------------------------------------------------------------------------------------------


def is_complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def list_checkpoints(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir() and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def find_latest(checkpoint_dir: str | Path) -> Path | None:
    """The folder named by ``latest`` when it is complete, else the complete checkpoint with the highest step."""
    root = Path(checkpoint_dir)
    marker = root / LATEST
    if marker.is_file():
        folder = root / marker.read_text().strip()
        if is_complete(folder):
            return folder
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resolve_resume(resume: str, checkpoint_dir: str | Path) -> Path | None:
    """``trainer.resume``: "auto" → the latest checkpoint or None; "disable" → None; else that folder."""
    if resume == "disable":
        return None
    if resume == "auto":
        return find_latest(checkpoint_dir)
    folder = Path(resume).expanduser()
    if not STEP_DIR.match(folder.name):
        raise ValueError(f"trainer.resume {resume!r}: name a global_step_N folder, or use auto / disable")
    if not is_complete(folder):
        raise FileNotFoundError(f"trainer.resume {resume!r}: no complete checkpoint there ({STATE_FILE} missing)")
    return folder


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """Write ``trainer_state.json`` (which marks the checkpoint complete) and the driver's RNG."""
    torch.save(rng_state(), folder / "driver_rng.pt")
    tmp = folder / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, folder / STATE_FILE)


def read_state(folder: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((folder / STATE_FILE).read_text())
    return state


def restore_driver_rng(folder: Path) -> None:
    path = folder / "driver_rng.pt"
    if path.exists():
        set_rng_state(torch.load(path, weights_only=False))


def mark_latest(checkpoint_dir: str | Path, folder: Path) -> None:
    root = Path(checkpoint_dir)
    tmp = root / (LATEST + ".tmp")
    tmp.write_text(folder.name + "\n")
    os.replace(tmp, root / LATEST)


def rotate(checkpoint_dir: str | Path, max_checkpoints: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``max_checkpoints`` (and never the one ``latest`` names)."""
    if not max_checkpoints:
        return []
    found = list_checkpoints(checkpoint_dir)
    latest = find_latest(checkpoint_dir)
    removed = []
    for _, folder in found[: max(0, len(found) - max_checkpoints)]:
        if folder != latest:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
