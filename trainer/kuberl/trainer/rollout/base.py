"""The rollout interface the driver and workers program against.

A backend turns token-id prompts into ``n`` sampled responses each and keeps its own copy of the policy weights,
refreshed after every actor update. The ``hf`` backend runs inside the actor process on a plain (unsharded) copy of
the model; the colocated ``vllm`` backend adds ``sleep``/``wake`` to release weights and KV cache while training
runs and receives weights in buckets (:meth:`Rollout.update_weights`); separate ``vllm`` engines receive them from
the trainer ranks over NCCL or CUDA IPC instead, and the driver calls them directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    """``N = len(prompts) × n`` rows; the ``n`` samples of prompt ``i`` are rows ``i·n … i·n + n − 1``."""

    prompts: Tensor
    """``(N, P)`` prompt ids, left-padded with the pad id."""
    prompt_mask: Tensor
    """``(N, P)`` 1 on real prompt tokens."""
    responses: Tensor
    """``(N, R)`` generated ids, right-padded with the pad id after eos (R = longest response)."""
    response_mask: Tensor
    """``(N, R)`` 1 on generated tokens up to and including the first eos."""
    log_probs: Tensor | None = None
    """``(N, R)`` the sampler's log-probs of the generated tokens, when the backend computes them."""

    def __len__(self) -> int:
        return int(self.responses.shape[0])

    def as_rows(self) -> dict[str, Tensor]:
        rows = {
            "prompts": self.prompts,
            "prompt_mask": self.prompt_mask,
            "responses": self.responses,
            "response_mask": self.response_mask,
        }
        if self.log_probs is not None:
            rows["rollout_log_probs"] = self.log_probs
        return rows


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """``(ids, mask)`` of shape ``(len(prompts), longest)``, padding on the left."""
    width = max((len(p) for p in prompts), default=0)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
    return ids, mask


def response_mask_from_eos(responses: Tensor, eos_ids: list[int]) -> Tensor:
    """1 up to and including the first eos of each row; rows without eos (truncated) are all 1."""
    is_eos = torch.isin(responses, torch.as_tensor(eos_ids, dtype=responses.dtype, device=responses.device))
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    return (~after_eos).long()


class Rollout(ABC):
    """A generation engine holding its own copy of the policy weights (how they arrive is the placement's)."""

    @abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        temperature: float,
        top_p: float,
        top_k: int,
        max_new_tokens: int,
        stop: tuple[str, ...] = (),
    ) -> RolloutBatch:
        """``n`` samples per prompt; ``temperature`` 0 is greedy, ``top_k`` −1 disables top-k. ``stop``: strings
        after which a backend may end a response early, the string included (the agent loop's tool-call end); a
        backend that generates on is correct too, the agent loop cuts the response there."""


class ColocatedRollout(Rollout):
    """An engine inside the actor rank's process: the rank hands it new weights and it gives memory back while
    training runs."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load full (unsharded) tensors by their Hugging Face names, e.g. streamed from the FSDP shards."""

    def sleep(self) -> None:
        """Release device memory while training runs (no-op unless the backend holds GPU memory)."""

    def wake(self) -> None:
        """Reacquire what :meth:`sleep` released."""

    @property
    def needs_weights(self) -> bool:
        """True when the engine holds no weights (e.g. after a sleep that dropped them) until update_weights."""
        return False


def make_rollout(engine: str, **kwargs: Any) -> ColocatedRollout:
    """The backend named by ``spec.rollout.engine``; imported lazily (vLLM pulls CUDA)."""
    if engine == "hf":
        from kuberl.trainer.rollout.hf import HFRollout

        return HFRollout(**kwargs)
    if engine == "vllm":
        try:
            from kuberl.trainer.rollout.vllm import VLLMRollout
        except ImportError as exc:
            raise RuntimeError(
                "rollout.engine vllm needs the GPU image (pip install 'kuberl[gpu]') and the vllm "
                f"backend module; use rollout.engine hf on CPU ({exc})"
            ) from exc
        return VLLMRollout(**kwargs)
    raise ValueError(f"unknown rollout engine {engine!r}; known: hf, vllm")
