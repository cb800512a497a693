"""How a call on a worker group is split over its ranks and how their results come back: one place for it (verl's
dispatch modes), declared on the worker method with :func:`dispatch` and applied by
:meth:`~kuberl.trainer.workers.group.WorkerGroup.call`. The driver never writes the split itself.

=============  ==========================================================  ========================================
mode           rank ``r`` receives                                         the caller gets
=============  ==========================================================  ========================================
``ALL``        the same arguments                                          every rank's result, in rank order
``ROWS``       the ``r``-th of ``ranks`` equal consecutive shares of the   the outputs concatenated back in row
               rows (verl's ``DataProto.chunk``)                           order, per key
``MINI_BATCH`` its slice of every mini-batch of ``mini_batch_rows``        every rank's result, in rank order
               consecutive rows, with each mini-batch's global token and
               row totals
``PROMPTS``    a consecutive share of the prompts: whole prompts when      every rank's rows, in rank order
               they divide evenly over the ranks, else single samples
``ITEMS``      the ``r``-th of ``ranks`` near-equal consecutive chunks of  the results flattened back into one list
               a list
=============  ==========================================================  ========================================
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from kuberl.trainer.model.microbatch import Rows, shard_mini_batches, shard_rows, slice_rows


class Dispatch(enum.Enum):
    ALL = "all"
    ROWS = "rows"
    MINI_BATCH = "mini_batch"
    PROMPTS = "prompts"
    ITEMS = "items"


MODE_ATTRIBUTE = "__kuberl_dispatch__"

Method = TypeVar("Method", bound=Callable[..., Any])


def dispatch(mode: Dispatch) -> Callable[[Method], Method]:
    """Declare how a worker method's calls are split over the ranks (methods without it: ``ALL``)."""

    def mark(method: Method) -> Method:
        setattr(method, MODE_ATTRIBUTE, mode)
        return method

    return mark


def mode_of(cls: type, method: str) -> Dispatch:
    mode: Dispatch = getattr(getattr(cls, method), MODE_ATTRIBUTE, Dispatch.ALL)
    return mode


def split(mode: Dispatch, ranks: int, args: tuple[Any, ...]) -> list[tuple[Any, ...] | None]:
    """Each rank's arguments of one call; None for a rank with nothing to do (``PROMPTS`` of fewer samples than
    ranks)."""
    if mode is Dispatch.ALL:
        return [args] * ranks
    if mode is Dispatch.ROWS:
        (rows,) = args
        return [(share,) for share in shard_rows(rows, ranks)]
    if mode is Dispatch.MINI_BATCH:
        rows, mini_batch_rows = args
        totals = mini_batch_totals(rows, mini_batch_rows)
        return [(mbs, totals) for mbs in shard_mini_batches(rows, mini_batch_rows=mini_batch_rows, dp=ranks)]
    if mode is Dispatch.PROMPTS:
        prompts, n, sampling = args
        return [share if share[0] else None for share in prompt_shares(prompts, n, sampling, ranks)]
    (items,) = args
    return [(list(chunk),) for chunk in np.array_split(np.array(items, dtype=object), ranks)]


def collect(mode: Dispatch, results: list[Any]) -> Any:
    if mode is Dispatch.ROWS:
        return {k: torch.cat([r[k] for r in results]) for k in results[0]}
    if mode is Dispatch.ITEMS:
        return [x for r in results for x in r]
    return results


def mini_batch_totals(rows: Rows, mini_batch_rows: int) -> list[dict[str, float]]:
    """Every mini-batch's valid response tokens and rows over all ranks: each micro-batch loss is its share of
    the global mini-batch loss."""
    return [
        {
            "tokens": float(slice_rows(rows, s, s + mini_batch_rows)["response_mask"].sum()),
            "seqs": float(mini_batch_rows),
        }
        for s in range(0, len(rows["responses"]), mini_batch_rows)
    ]


def prompt_shares(
    prompts: list[list[int]], n: int, sampling: dict[str, Any], ranks: int
) -> list[tuple[list[list[int]], int, dict[str, Any]]]:
    if len(prompts) % ranks == 0:
        per = len(prompts) // ranks
        return [(prompts[r * per : (r + 1) * per], n, sampling) for r in range(ranks)]
    expanded = [p for p in prompts for _ in range(n)]
    chunks = np.array_split(np.arange(len(expanded)), ranks)
    return [([expanded[i] for i in c], 1, sampling) for c in chunks]
