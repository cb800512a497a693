"""A reward model: a sequence-classification model that scores ``prompt + response`` texts."""

import torch


class RewardModelScorer:
    """A sequence-classification reward model: one score per text, read at its last token.

    Texts are tokenized as given (apply the reward model's own chat template first), right-padded and truncated on
    the right to ``max_length``, and scored in micro-batches of ``micro_batch_size``. The last token is located
    from the attention mask rather than by searching for the pad id, which fails when pad and eos share an id.
    """

    def __init__(
        self,
        path: str,
        *,
        micro_batch_size: int,
        dtype: torch.dtype,
        max_length: int,
        device: str | torch.device = "cpu",
    ) -> None:
        if micro_batch_size < 1 or max_length < 1:
            raise ValueError(
                f"reward model {path!r}: micro_batch_size ({micro_batch_size}) and max_length "
                f"({max_length}) must be ≥ 1"
            )
        from kuberl.trainer.model.loading import load_sequence_classifier, load_tokenizer

        self.model = load_sequence_classifier(path, dtype)
        module: torch.nn.Module = self.model  # nn.Module.to's signature: transformers' override is untyped
        module.to(device).eval()
        if not hasattr(self.model, "score"):
            raise ValueError(
                f"reward model {path!r} ({type(self.model).__name__}) has no 'score' head; use a "
                "decoder saved as AutoModelForSequenceClassification"
            )
        self.tokenizer = load_tokenizer(path)
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "right"
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length
        self.device = torch.device(device)

    @torch.inference_mode()
    def score(self, texts: list[str]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(texts), self.micro_batch_size):
            batch = self.tokenizer(
                texts[start : start + self.micro_batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = getattr(self.model, self.model.base_model_prefix)(**batch).last_hidden_state
            last = batch["attention_mask"].sum(dim=-1) - 1
            pooled = hidden[torch.arange(hidden.shape[0], device=self.device), last]
            scores.extend(self.model.get_submodule("score")(pooled)[:, 0].float().tolist())
        return scores
