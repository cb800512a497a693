"""Real models' shapes with random weights, for GPU benchmarks whose timings depend on shapes only (no download).

random_config("qwen2-0.5b")             # a transformers config with Qwen2-0.5B's shape
random_causal_lm("smollm2-shape", "cpu")  # that model, seeded random init, fp32
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    bos_token_id=151643,
    eos_token_id=151645,
)
"""Qwen2-0.5B's shape (494M parameters), randomly initialised: no download needed."""
SMOLLM2_SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
)
"""SmolLM2-135M's shape, randomly initialised (sync time depends on shapes only, not on the values)."""
RANDOM = {"qwen2-0.5b": ("qwen2", QWEN2_05B), "smollm2-shape": ("llama", SMOLLM2_SHAPE)}
"""Benchmark model name → (transformers model type, config fields)."""


def random_config(name: str) -> PretrainedConfig:
    from transformers import AutoConfig

    if name not in RANDOM:
        raise KeyError(f"no random shape named {name!r}; known: {sorted(RANDOM)}")
    family, shape = RANDOM[name]
    return AutoConfig.for_model(family, **shape)


def random_causal_lm(name: str, device: str) -> PreTrainedModel:
    """``name``'s shape in fp32 on ``device``, initialised from seed 0."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(random_config(name), dtype=torch.float32)
