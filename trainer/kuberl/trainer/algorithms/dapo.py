"""DAPO's batch recipe (Yu et al. 2025, arXiv 2503.14476): overlong reward shaping and dynamic sampling.

Shapes: ``B`` responses; ``response_lengths``, ``group_ids`` and ``metric`` are ``(B,)``, ``group_ids`` marking
the responses sampled from the same prompt. The driver calls these once per generation round: score, add
:func:`overlong_penalty` to the scores, then feed the round to a :class:`DynamicSampler` until it is full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import Tensor

from kuberl.trainer.model.microbatch import Rows, concat, select

T = TypeVar("T")


class DynamicSamplingExhausted(RuntimeError):
    """Too few groups survived the filter within ``algorithm.filterGroups.maxNumGenBatches`` rounds."""


def overlong_penalty(
    response_lengths: Tensor, *, max_response_length: int, buffer_length: int, penalty_factor: float
) -> Tensor:
    """DAPO's soft overlong punishment, added to each response's reward, ``(B,)``.

    0 up to L_max − L_cache tokens, then −penalty_factor·(len − (L_max − L_cache)) / L_cache: a linear ramp
    reaching −penalty_factor at len = L_max (verl's ``overlong_buffer``: len, penalty_factor).
    """
    if not 1 <= buffer_length < max_response_length:
        raise ValueError(
            f"overlong buffer length {buffer_length} must be in 1..{max_response_length - 1} "
            f"(below max_response_length {max_response_length})"
        )
    exceed = response_lengths.to(torch.float32) - (max_response_length - buffer_length)
    return (-exceed / buffer_length * penalty_factor).clamp(max=0.0)


def keep_groups(group_ids: Tensor, metric: Tensor) -> Tensor:
    """Which responses to keep, ``(B,)`` bool: those whose group's metric is not the same for every response.

    A group whose responses all score alike has zero advantage under group baselines and teaches nothing.
    A group of one is kept, as verl keeps it.
    """
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    values = metric.to(torch.float64)
    high = values.new_full((n_groups,), -torch.inf).scatter_reduce(0, group, values, "amax")
    low = values.new_full((n_groups,), torch.inf).scatter_reduce(0, group, values, "amin")
    kept: Tensor = ((high > low) | (counts == 1))[group]
    return kept


@dataclass
class DynamicSampler(Generic[T]):
    """Collects the kept groups of successive generation rounds until ``target_groups`` prompts are in.

    ``add`` one round at a time while ``full`` is false; ``batch`` gives the first ``target_groups`` kept groups,
    in the order they were generated. Group ids are renumbered 0..G−1 so groups of different rounds never meet.
    A round that ends ``max_rounds`` without filling it raises :class:`DynamicSamplingExhausted`.
    """

    target_groups: int
    max_rounds: int
    pad_id: int = 0
    """Fills the response columns of rounds whose responses are shorter than the longest kept one."""
    rounds: int = 0
    kept_groups: int = 0
    dropped_groups: int = 0
    _rows: list[Rows] = field(default_factory=list)
    _items: list[T] = field(default_factory=list)
    _groups: list[Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.target_groups < 1 or self.max_rounds < 1:
            raise ValueError(f"target_groups ({self.target_groups}) and max_rounds ({self.max_rounds}) must be ≥ 1")

    @property
    def full(self) -> bool:
        return self.kept_groups >= self.target_groups

    def add(self, rows: Rows, items: Sequence[T], group_ids: Tensor, metric: Tensor) -> None:
        """Keep this round's groups whose metric varies; ``items`` are per-response objects (e.g. the prompts).

        Raises :class:`DynamicSamplingExhausted` when this was the last allowed round and the sampler is not full,
        so no round is generated in vain."""
        self.rounds += 1
        keep = keep_groups(group_ids, metric)
        index = keep.nonzero().squeeze(-1)
        _, kept = torch.unique(group_ids[index], return_inverse=True)
        total = int(torch.unique(group_ids).numel())
        n_kept = int(kept.max()) + 1 if index.numel() else 0
        self._rows.append(select(rows, index))
        self._items.extend(items[i] for i in index.tolist())
        self._groups.append(kept + self.kept_groups)
        self.kept_groups += n_kept
        self.dropped_groups += total - n_kept
        if not self.full and self.rounds >= self.max_rounds:
            raise DynamicSamplingExhausted(
                f"dynamic sampling kept {self.kept_groups} of the {self.target_groups} prompts of batch.trainBatchSize "
                f"after algorithm.filterGroups.maxNumGenBatches = {self.max_rounds} generation rounds "
                f"({self.dropped_groups} groups dropped: every response scored the same); raise maxNumGenBatches, "
                "use easier data, or turn filterGroups off"
            )

    def batch(self) -> tuple[Rows, list[T], Tensor]:
        """The first ``target_groups`` kept groups: rows, per-response items, group ids in 0..target_groups−1."""
        if not self.full:
            raise RuntimeError(f"dynamic sampler holds {self.kept_groups} of {self.target_groups} groups")
        group_ids = torch.cat(self._groups)
        index = (group_ids < self.target_groups).nonzero().squeeze(-1)
        rows = select(concat([r for r in self._rows if r["responses"].shape[0]], self.pad_id), index)
        return rows, [self._items[i] for i in index.tolist()], group_ids[index]

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic_sampling/kept_groups": float(self.kept_groups),
            "dynamic_sampling/dropped_groups": float(self.dropped_groups),
            "dynamic_sampling/rounds": float(self.rounds),
        }
