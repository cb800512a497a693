"""``kuberl export``: a checkpoint's policy as a Hugging Face folder, written by ``save_pretrained``.

The folder is what the hub serves: safetensors shards of at most ``max_shard_size`` with
``model.safetensors.index.json`` when there is more than one, config, generation config and tokenizer, in the
dtype asked for, LoRA merged. It is written next to the target and renamed into place, so a failed export leaves
nothing half-written, and an existing target is replaced only when asked to.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from kuberl.trainer.checkpoint import files as ckpt
from kuberl.trainer.checkpoint.model_card import model_card
from kuberl.trainer.checkpoint.shards import load_full_model_state
from kuberl.trainer.observe.metrics import RUN_RECORD


class ExportError(ValueError):
    """The source holds no checkpoint, or the target exists."""


def run_record(run_dir: Path) -> dict[str, Any]:
    """What a ``kuberl run`` folder recorded (its RLJob, spec and checkpointDir); empty for another folder."""
    record = run_dir / RUN_RECORD
    if not record.is_file():
        return {}
    data: dict[str, Any] = json.loads(record.read_text())
    return data


def checkpoint_dir_of_run(run_dir: Path) -> Path | None:
    """The checkpointDir a ``kuberl run`` folder recorded, as an absolute path; None when it recorded none."""
    folder = run_record(run_dir).get("checkpointDir")
    return Path(folder) if folder else None


def find_checkpoint(source: str | Path) -> Path:
    """A ``global_step_N`` folder itself, else the latest checkpoint of a checkpointDir or of a run folder."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        raise ExportError(f"{folder} does not exist or is not a folder")
    if ckpt.STEP_DIR.match(folder.name):
        if not ckpt.is_complete(folder):
            raise ExportError(f"{folder} is an incomplete checkpoint ({ckpt.MANIFEST} missing): the save was cut off")
        return folder
    latest = ckpt.find_latest(folder)
    recorded = checkpoint_dir_of_run(folder)
    if latest is None and recorded is not None:
        latest = ckpt.find_latest(recorded)
    if latest is None:
        tried = f"; its run record names checkpointDir {recorded}, which holds none" if recorded else ""
        raise ExportError(
            f"{folder} holds no complete checkpoint: pass a global_step_N folder, a trainer.checkpointDir or a "
            f"`kuberl run` folder{tried}"
        )
    return latest


def file_mode() -> int:
    """What a newly created file gets under the current umask (0644 under the usual 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def export_checkpoint(
    checkpoint: Path,
    out: str | Path,
    *,
    dtype: str = "bfloat16",
    max_shard_size: str = "5GB",
    force: bool = False,
    spec: dict[str, Any] | None = None,
) -> Path:
    """The policy of `checkpoint` as a Hugging Face folder with a model card (README.md; richer with the run's
    `spec`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from kuberl.trainer.model.fsdp import merge_lora

    target = Path(out).expanduser()
    if target.exists() and not force:
        raise ExportError(f"{target} exists; pass --force to replace it")
    damage = ckpt.verify(checkpoint)
    if damage is not None:
        raise ExportError(f"cannot export {checkpoint}: it is damaged ({damage}); export an earlier checkpoint")
    actor = checkpoint / "actor"
    state = load_full_model_state(actor)
    lora = json.loads((actor / "lora.json").read_text()) if (actor / "lora.json").exists() else {}
    if lora.get("scaling"):
        state = merge_lora(state, lora["scaling"])
    config = AutoConfig.from_pretrained(actor / "hf")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict({name: tensor.to(getattr(torch, dtype)) for name, tensor in state.items()}, assign=True)
    model.tie_weights()
    staging = target.with_name(f".{target.name}.export-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.save_pretrained(staging, max_shard_size=max_shard_size)
        AutoTokenizer.from_pretrained(actor / "hf").save_pretrained(staging)
        (staging / "README.md").write_text(model_card(checkpoint, ckpt.read_state(checkpoint), spec, dtype))
        mode = file_mode()  # safetensors writes 0600; a model folder is for others to read
        for path in staging.iterdir():
            path.chmod(mode)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
