"""The shape of a model.path without loading its weights: for `kuberl plan`.

Reads `tiny://` parameters, a GGUF file's metadata, or a Hugging Face `config.json`.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from kuberl.api.memory import ModelShape, config_shape, declared_shape
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import InvalidSpec, Issue
from kuberl.trainer.model.loading import (
    TINY_SCHEME,
    WHAT_TO_PASS,
    ModelNotFoundError,
    local_source,
    parse_tiny,
    tiny_tokenizer,
)


def model_shape(path: str) -> ModelShape:
    if path.startswith(TINY_SCHEME):
        tiny = parse_tiny(path)
        return ModelShape(
            vocab=len(tiny_tokenizer()),
            hidden=tiny.hidden,
            layers=tiny.layers,
            heads=tiny.heads,
            kv_heads=tiny.kv_heads,
            intermediate=tiny.intermediate,
            tie_embeddings=tiny.tie,
            qkv_bias=tiny.family == "qwen2",
        )
    local = local_source(path, allow_patterns=["config.json"])
    if local.is_file() and local.suffix == ".gguf":
        return gguf_shape(local)
    config = local / "config.json" if local.is_dir() else local
    if config.is_file() and config.name.endswith(".json"):
        return config_shape(json.loads(config.read_text()))
    raise ModelNotFoundError(f"{path!r}: no model config found; {WHAT_TO_PASS}")


def checked_model_shape(spec: RLJobSpec) -> ModelShape:
    """model.path's shape; InvalidSpec where model.shape declares another, which admission planned the job with."""
    shape = model_shape(spec.model.path)
    declared = declared_shape(spec)
    if declared is None:
        return shape
    shape, declared = replace(shape, head_dim=shape.dim), replace(declared, head_dim=declared.dim)
    if declared == shape:
        return shape
    differs = ", ".join(
        f"{f.name} {getattr(declared, f.name)} (the model: {getattr(shape, f.name)})"
        for f in fields(ModelShape)
        if getattr(declared, f.name) != getattr(shape, f.name)
    )
    message = (
        f"declares another shape than {spec.model.path}'s config: {differs}; admission planned the job's memory "
        "with model.shape: copy it from the model's config.json, or remove it"
    )
    raise InvalidSpec([Issue("spec.model.shape", message, "shape-of-the-model")])


def gguf_shape(path: Path) -> ModelShape:
    """From a GGUF file's metadata (the tensors are memory-mapped, never read)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(name: str) -> Any:
        entry = reader.fields.get(name)
        if entry is None:
            return None
        return entry.contents()

    arch = field("general.architecture")
    heads = int(field(f"{arch}.attention.head_count"))
    tokens = field("tokenizer.ggml.tokens") or []
    tensor_names = {t.name for t in reader.tensors}
    return ModelShape(
        vocab=len(tokens),
        hidden=int(field(f"{arch}.embedding_length")),
        layers=int(field(f"{arch}.block_count")),
        heads=heads,
        kv_heads=int(field(f"{arch}.attention.head_count_kv") or heads),
        intermediate=int(field(f"{arch}.feed_forward_length")),
        tie_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
    )
