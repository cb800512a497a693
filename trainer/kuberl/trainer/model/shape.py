"""The shape of a model.path without loading its weights: for `kuberl plan`.

Reads `tiny://` parameters, a GGUF file's metadata, or a Hugging Face `config.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kuberl.api.memory import ModelShape
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


def config_shape(config: dict[str, Any]) -> ModelShape:
    """From a Hugging Face config.json (Llama, Qwen2/3, Mistral, Gemma-style keys)."""
    text = config.get("text_config", config)
    heads = int(text["num_attention_heads"])
    return ModelShape(
        vocab=int(text["vocab_size"]),
        hidden=int(text["hidden_size"]),
        layers=int(text["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        intermediate=int(text["intermediate_size"]),
        tie_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        qkv_bias=bool(text.get("attention_bias", text.get("model_type") == "qwen2")),
        head_dim=int(text.get("head_dim") or 0),
    )


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
