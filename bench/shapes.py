"""Real models' shapes with random weights, for GPU benchmarks whose timings depend on shapes only (no download).

random_config("qwen2-0.5b")             # a transformers config with Qwen2-0.5B's shape
random_causal_lm("smollm2-shape", "cpu")  # that model, seeded random init, fp32
python bench/shapes.py llama-1.1b /tmp/llama-1.1b --tokenizer smollm2   # a HF folder for kuberl, vLLM and TRL
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
LLAMA_11B = dict(
    SMOLLM2_SHAPE,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=16,
    num_key_value_heads=8,
)
"""A 1.14B llama (TinyLlama's widths, 16/8 heads) over SmolLM2's 49k vocabulary: the large model of the GRPO
benchmark, with SmolLM2's tokenizer so both models see the same prompts."""
RANDOM = {
    "qwen2-0.5b": ("qwen2", QWEN2_05B),
    "smollm2-shape": ("llama", SMOLLM2_SHAPE),
    "llama-1.1b": ("llama", LLAMA_11B),
}
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


def save_random(name: str, folder: str, tokenizer: str) -> None:
    """``name``'s shape with seeded random weights (bf16) and ``tokenizer``'s tokenizer (any ``model.path``) as a
    Hugging Face folder, which kuberl, vLLM and TRL all load."""
    import torch
    from transformers import AutoTokenizer

    from kuberl.trainer.rollout.vllm import model_folder

    model = random_causal_lm(name, "cuda" if torch.cuda.is_available() else "cpu").to(torch.bfloat16)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_folder(tokenizer)).save_pretrained(folder)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters in {folder}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a random-weight model of a benchmark shape as a HF folder.")
    parser.add_argument("name", choices=sorted(RANDOM))
    parser.add_argument("folder")
    parser.add_argument("--tokenizer", default="smollm2", help="model.path whose tokenizer the folder gets")
    args = parser.parse_args()
    save_random(args.name, args.folder, args.tokenizer)
