"""A role's state in a checkpoint, written and read inside every rank: the model's and optimizer's shards
(``torch.distributed.checkpoint``, each rank its own, in parallel; read back on any number of ranks), the
scheduler and each rank's RNG. Collectives: all ranks of the group call them. The folder layout and the atomic
writes are :mod:`kuberl.trainer.checkpoint.files`'s."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from kuberl.trainer.checkpoint.files import PARTIAL, load_rng, publish_dir, save_rng, write_json

log = logging.getLogger(__name__)


def save_sharded(
    folder: str | Path, *, rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> None:
    """Every rank writes its own shards of model and optimizer (``torch.distributed.checkpoint``) and its RNG;
    rank 0 writes the scheduler. A collective: all ranks call."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer)
    for name, state in (("model", model_state), ("optim", optim_state)):
        tmp = folder / (name + PARTIAL)
        save(state, storage_writer=FileSystemWriter(tmp, sync_files=True))
        barrier()
        if rank == 0:
            publish_dir(tmp, folder / name)
        barrier()
    if rank == 0:
        write_json(folder / "scheduler.json", scheduler.state_dict())
    save_rng(folder / f"rng_rank{rank}.pt")
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
    """Every rank reads the pieces of the shards it owns now (any rank count); a collective: all ranks call."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load

    folder = Path(folder)
    model_state = get_model_state_dict(model)
    load(model_state, checkpoint_id=folder / "model")
    set_model_state_dict(model, model_state)
    del model_state
    if optimizer is not None:
        optim_state = get_optimizer_state_dict(model, optimizer)
        load(optim_state, checkpoint_id=folder / "optim")
        set_optimizer_state_dict(model, optimizer, optim_state)
    if scheduler is not None:
        scheduler.load_state_dict(json.loads((folder / "scheduler.json").read_text()))
    rng_file = folder / f"rng_rank{rank}.pt"
    if rng_file.exists():
        load_rng(rng_file)
    else:  # fewer ranks saved than now: a new rank gets a fresh, still deterministic, sampling stream
        log.warning("%s missing (the checkpoint was saved with fewer ranks): seeding rank %d afresh", rng_file, rank)


def load_full_model_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """The whole model state dict of ``<role>/model`` in one process (``kuberl export``), without a model."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    reader = FileSystemReader(Path(folder) / "model")
    metadata = reader.read_metadata()
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    load(state, storage_reader=reader, no_dist=True)
    return state


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
