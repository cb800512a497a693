"""The ``hf`` rollout: transformers ``generate`` on a plain copy of the policy, batched, prompts left-padded.

It lives inside each actor rank's process (colocated). Each rank generates its share of the prompts with a full,
unsharded copy of the weights that the rank refreshes after every update from the FSDP shards (``full_tensor`` per
parameter); generating through the sharded model instead would all-gather every layer for every new token.

On CPU it can also run separate (:class:`HFEngineActor`, one Ray actor per engine), which is how CI exercises the
separate placement, the overlapped one-step-off-policy loop and the asynchronous one with partial rollouts without
GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import Tensor
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

from kuberl.trainer.rollout.base import ColocatedRollout, RolloutBatch, left_pad, response_mask_from_eos


class HFRollout(ColocatedRollout):
    def __init__(
        self,
        model: PreTrainedModel,
        *,
        pad_id: int,
        eos_ids: list[int],
        max_batch_size: int = 256,
        calculate_log_probs: bool = False,
        device: str | torch.device = "cpu",
    ) -> None:
        module: torch.nn.Module = model  # nn.Module.to's signature: transformers' override is untyped
        module.to(device).eval()
        self.model = model
        self.model.requires_grad_(False)
        if not isinstance(model, GenerationMixin):
            raise TypeError(f"{type(model).__name__} cannot generate; the hf rollout needs a causal LM")
        self.generator: GenerationMixin = model
        self.pad_id = pad_id
        self.eos_ids = list(eos_ids)
        self.max_batch_size = max_batch_size
        self.calculate_log_probs = calculate_log_probs
        self.device = torch.device(device)
        # Sampling is set on every call; the model's own generation defaults (repetition penalty, …) must not leak in.
        self.model.generation_config = GenerationConfig(
            pad_token_id=pad_id, eos_token_id=self.eos_ids, bos_token_id=model.config.bos_token_id
        )

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = -1,
        max_new_tokens: int,
        stop: tuple[str, ...] = (),
        interrupt: threading.Event | None = None,
    ) -> RolloutBatch:
        """``stop`` is not applied: generation runs to eos or ``max_new_tokens`` (the agent loop cuts at the call).
        ``interrupt``: once set, every row stops after its current token and the batch says which rows had ended
        anyway (:attr:`RolloutBatch.finished`)."""
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        expanded = [p for p in prompts for _ in range(n)]
        parts = [
            self._generate_chunk(
                expanded[i : i + self.max_batch_size], temperature, top_p, top_k, max_new_tokens, interrupt
            )
            for i in range(0, len(expanded), self.max_batch_size)
        ]
        if len(parts) == 1:
            return parts[0]
        from kuberl.trainer.model.microbatch import concat

        return RolloutBatch.from_rows(concat([p.as_rows() for p in parts], self.pad_id))

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        temperature: float,
        top_p: float,
        top_k: int,
        max_new_tokens: int,
        interrupt: threading.Event | None,
    ) -> RolloutBatch:
        ids, mask = left_pad(prompts, self.pad_id)
        sample = temperature > 0
        config = GenerationConfig(
            do_sample=sample,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            temperature=temperature if sample else None,
            top_p=top_p if sample else None,
            top_k=(0 if top_k < 0 else top_k) if sample else None,
            num_beams=1,
            repetition_penalty=1.0,
            output_logits=self.calculate_log_probs,
            return_dict_in_generate=True,
        )
        out = self.generator.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([Interrupted(interrupt)]) if interrupt is not None else None,
        )
        sequences = out.sequences[:, ids.shape[1] :].cpu()
        if sequences.shape[1] == 0:  # max_new_tokens 0 is refused by validation; keep shapes sane anyway
            sequences = torch.full((len(prompts), 1), self.pad_id, dtype=torch.long)
        response_mask = response_mask_from_eos(sequences, self.eos_ids)
        responses = sequences.masked_fill(response_mask == 0, self.pad_id)
        log_probs = None
        if self.calculate_log_probs:
            logits = torch.stack(out.logits, dim=1).float().cpu()
            if sample:
                logits = logits / temperature
            log_probs = torch.log_softmax(logits, -1).gather(-1, sequences.unsqueeze(-1)).squeeze(-1)
            log_probs = log_probs * response_mask
        finished = None
        if interrupt is not None:  # a row without eos ran to the budget, or was stopped short of it
            has_eos = torch.isin(sequences, torch.as_tensor(self.eos_ids, dtype=sequences.dtype)).any(-1)
            finished = has_eos | (sequences.shape[1] >= max_new_tokens)
        return RolloutBatch(ids, mask, responses, response_mask, log_probs, finished=finished)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        state = dict(self.model.named_buffers())
        state.update(self.model.state_dict(keep_vars=True))  # every name, tied duplicates included
        for name, tensor in named_tensors:
            target = state.get(name)
            if target is None:
                raise KeyError(f"rollout model has no tensor {name!r}; the actor and rollout architectures differ")
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))


class Interrupted(StoppingCriteria):
    """Stops every row of a ``generate`` once ``event`` is set (checked after each token)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        stop: torch.BoolTensor = torch.full(  # type: ignore[assignment]  # a BoolTensor is a bool-dtype Tensor
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )
        return stop


class HFEngineActor:
    """A Ray actor holding one CPU engine of a separate ``hf`` rollout: its own copy of the policy, refreshed from
    the Ray object store (:class:`~kuberl.trainer.rollout.weight_sync.ObjectStoreSender`), every batch stamped with the
    version of the weights it holds.

    It runs threaded (:data:`ACTOR_OPTIONS`): a weight load arriving during a generation waits for it under one lock
    or, with ``partial_rollouts``, stops it first (the batch returned then says which rows had not finished)."""

    ACTOR_OPTIONS: ClassVar[dict[str, Any]] = {"max_concurrency": 2}
    """A weight load and a generation may arrive together: the load stops the generation rather than queue behind."""

    def __init__(
        self,
        model_path: str,
        *,
        pad_id: int,
        eos_ids: list[int],
        seed: int,
        threads: int,
        calculate_log_probs: bool,
        max_batch_size: int,
        partial_rollouts: bool = False,
    ) -> None:
        from kuberl.trainer.model.loading import load_causal_lm

        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.rollout = HFRollout(
            load_causal_lm(model_path, torch.float32),
            pad_id=pad_id,
            eos_ids=eos_ids,
            calculate_log_probs=calculate_log_probs,
            max_batch_size=max_batch_size,
        )
        self.weight_version = 0
        self.partial_rollouts = partial_rollouts
        self.generating = threading.Lock()
        self.new_weights = threading.Event()
        """Set while a weight load waits for the generation in flight to stop (partial rollouts)."""

    def ready(self) -> bool:
        return True

    def generate(self, prompts: list[list[int]], n: int, sampling: dict[str, Any]) -> dict[str, Tensor]:
        with self.generating:
            interrupt = self.new_weights if self.partial_rollouts else None
            batch = self.rollout.generate(prompts, n, **sampling, interrupt=interrupt)
            return batch.stamped(self.weight_version).as_rows()

    def load_weights(self, state: dict[str, Tensor], version: int) -> None:
        """Ray resolves the object-store reference the trainer sent into ``state`` before the call."""
        if self.partial_rollouts:
            self.new_weights.set()
        with self.generating:
            self.new_weights.clear()
            self.rollout.update_weights(state.items())
            self.weight_version = version
