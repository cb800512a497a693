"""Rows of prompt + response tokens, and how they are cut into mini- and micro-batches.

A batch of ``B`` rows is a plain ``dict[str, Tensor]`` (``Rows``), every tensor ``(B, ...)``:

- ``prompts`` ``(B, P)`` left-padded prompt ids, ``prompt_mask`` ``(B, P)``;
- ``responses`` ``(B, R)`` right-padded response ids, ``response_mask`` ``(B, R)`` (1 up to and including eos);
- per-token values over the response, ``(B, R)``: ``old_log_probs``, ``ref_log_probs``, ``values``,
  ``advantages``, ``returns``.

Micro-batches are either a fixed number of rows (``ppoMicroBatchSizePerGPU``) or, with dynamic batch size, as many
rows as fit a token budget: greedy first-fit-decreasing bin packing where a bin costs the sum of its rows' real
prompt + response tokens. Either way a step runs its largest micro-batch first (:func:`largest_first`, for the
allocator's sake). Every pass of the trainer then sees a micro-batch as one packed sequence (:func:`pack`,
verl's ``use_remove_padding``): the rows' real tokens concatenated, no padding, attention kept inside each row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

Rows = dict[str, Tensor]

PER_TOKEN_KEYS = ("old_log_probs", "ref_log_probs", "values", "advantages", "returns")


def num_rows(rows: Rows) -> int:
    return int(rows["responses"].shape[0])


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor`` on ``device``. A host tensor bound for a GPU is copied from pinned memory without blocking: a plain
    copy from pageable memory waits for every kernel already queued, so the host could not queue a micro-batch's
    forward while the GPU still runs the previous one's backward."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def rows_to(rows: Rows, device: torch.device) -> Rows:
    return {key: to_device(value, device) for key, value in rows.items()}


def select(rows: Rows, index: list[int] | Tensor) -> Rows:
    idx = torch.as_tensor(index, dtype=torch.long)
    return {k: v.index_select(0, idx) for k, v in rows.items()}


def slice_rows(rows: Rows, start: int, stop: int) -> Rows:
    return {k: v[start:stop] for k, v in rows.items()}


def pad_left(t: Tensor, width: int, value: float) -> Tensor:
    if t.shape[1] >= width:
        return t
    fill = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([fill, t], dim=1)


def pad_right(t: Tensor, width: int, value: float) -> Tensor:
    if t.shape[1] >= width:
        return t
    fill = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), value)
    return torch.cat([t, fill], dim=1)


def concat(parts: list[Rows], pad_id: int = 0) -> Rows:
    """Stack row sets whose prompt/response widths differ: prompts are re-padded on the left, the rest on the right."""
    p = max(r["prompts"].shape[1] for r in parts)
    r_width = max(r["responses"].shape[1] for r in parts)
    out: Rows = {}
    for key in parts[0]:
        if key in ("prompts", "prompt_mask"):
            value = pad_id if key == "prompts" else 0
            out[key] = torch.cat([pad_left(r[key], p, value) for r in parts])
        elif parts[0][key].dim() >= 2:
            value = pad_id if key == "responses" else 0
            out[key] = torch.cat([pad_right(r[key], r_width, value) for r in parts])
        else:
            out[key] = torch.cat([r[key] for r in parts])
    return out


def response_attention(rows: Rows) -> Tensor:
    """1 on every real response token. Multi-turn rows carry it apart from ``response_mask`` (policy tokens only,
    what the loss sees): tool outputs are context for the policy but not its actions."""
    return rows.get("response_attention_mask", rows["response_mask"])


def lengths(rows: Rows) -> tuple[Tensor, Tensor]:
    """Real prompt and response lengths per row, ``(B,)`` each."""
    return rows["prompt_mask"].sum(-1).long(), response_attention(rows).sum(-1).long()


def trim(rows: Rows) -> Rows:
    """Drop prompt columns that are padding in every row and response columns past the longest response."""
    prompt_len, response_len = lengths(rows)
    p = max(int(prompt_len.max()), 1)
    r = max(int(response_len.max()), 1)
    out: Rows = {}
    for key, value in rows.items():
        if key in ("prompts", "prompt_mask"):
            out[key] = value[:, value.shape[1] - p :]
        elif value.dim() >= 2:
            out[key] = value[:, :r]
        else:
            out[key] = value
    return out


def model_inputs(rows: Rows) -> tuple[Tensor, Tensor, Tensor]:
    """``input_ids``, ``attention_mask``, ``position_ids`` of prompt + response, ``(B, P + R)``.

    Positions count real tokens only, so a left-padded prompt starts at position 0 as in generation.
    """
    input_ids = torch.cat([rows["prompts"], rows["responses"]], dim=1)
    attention_mask = torch.cat([rows["prompt_mask"], response_attention(rows)], dim=1).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


@dataclass(frozen=True)
class Packed:
    """A micro-batch as one sequence of its ``T`` real tokens (prompt + response of each row, in row order).

    ``position_ids`` restart at 0 with every row; with no attention mask, Hugging Face models read the restarts as
    sequence boundaries (a block-diagonal causal mask for SDPA/eager, varlen ``cu_seqlens`` for flash-attention),
    so every row attends to itself only, as in the padded batch.
    """

    input_ids: Tensor
    """``(1, T)``"""
    position_ids: Tensor
    """``(1, T)``"""
    predictors: Tensor
    """``(N,)``: the index in ``T`` of the token whose output predicts each of the ``N`` valid response tokens."""
    targets: Tensor
    """``(N,)``: those response token ids."""
    response_index: Tensor
    """``(N,)``: where each valid response token sits in the ``(b, r)`` rows, as a flat index, found on the host."""
    rows_shape: tuple[int, int]
    """``(b, r)``: the trimmed rows' shape."""
    cu_seq_lens: Tensor
    """``(b + 1,)`` int32: where each row starts in ``T``, then ``T`` (flash-attention's ``cu_seqlens``)."""
    longest: int
    """The longest row's tokens, read on the host when packing (reading it on the GPU would wait for the device)."""

    def to(self, device: torch.device) -> Packed:
        """The same micro-batch with its tensors on ``device`` (:func:`to_device`: no wait for queued kernels)."""
        moved: dict[str, Any] = {
            f.name: to_device(value, device) for f in fields(self) if isinstance(value := getattr(self, f.name), Tensor)
        }
        return replace(self, **moved)

    def attention_kwargs(self) -> dict[str, Tensor | int]:
        """The row bounds as transformers' flash-attention keyword arguments of a model's forward."""
        cu = self.cu_seq_lens
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": self.longest, "max_length_k": self.longest}

    def unpack(self, values: Tensor) -> Tensor:
        """Per-token ``(N,)`` values back to ``(b, r)`` rows, 0 at padding (differentiable); ``values`` on the
        packed tensors' device. A scatter to known indices: a masked scatter's backward selects by mask, and finding
        how many elements a mask selects waits for the GPU, once per micro-batch of an update."""
        return (
            values.new_zeros(self.rows_shape[0] * self.rows_shape[1])
            .scatter(0, self.response_index, values)
            .view(self.rows_shape)
        )


def pack(rows: Rows) -> Packed:
    """The rows' real tokens as one packed sequence; see :class:`Packed`.

    The token that predicts response token ``j`` of a row is the one before it (the last prompt token for ``j =
    0``); the response mask must therefore be contiguous from the first response token. Pack rows on the host and
    move the result (:meth:`Packed.to`): on a GPU, the boolean indexing here would wait for every queued kernel.
    """
    input_ids, attention_mask, position_ids = model_inputs(rows)
    real = attention_mask.bool()
    p = rows["prompts"].shape[1]
    r = rows["responses"].shape[1]
    response_mask = rows["response_mask"].bool()
    predictor_real = real[:, p - 1 : p + r - 1]
    if bool((response_mask & ~predictor_real).any()):
        raise ValueError("response_mask has a gap or a row has no prompt token: a response token has no predictor")
    packed_index = real.flatten().long().cumsum(0).view_as(real) - 1
    row_tokens = real.sum(-1)
    return Packed(
        input_ids=input_ids[real].unsqueeze(0),
        position_ids=position_ids[real].unsqueeze(0),
        predictors=packed_index[:, p - 1 : p + r - 1][response_mask],
        targets=rows["responses"][response_mask],
        response_index=response_mask.flatten().nonzero().squeeze(1),
        rows_shape=(response_mask.shape[0], response_mask.shape[1]),
        cu_seq_lens=torch.nn.functional.pad(row_tokens.cumsum(0), (1, 0)).to(torch.int32),
        longest=int(row_tokens.max()),
    )


def split_fixed(n: int, size: int) -> list[list[int]]:
    """Consecutive micro-batches of ``size`` rows (the last may be smaller when ``size`` does not divide ``n``)."""
    if size < 1:
        raise ValueError(f"micro-batch size must be ≥ 1, got {size}")
    return [list(range(start, min(start + size, n))) for start in range(0, n, size)]


def bin_cost(prompt_lens: list[int], response_lens: list[int]) -> int:
    """Tokens of a micro-batch's packed sequence (:func:`pack`): its real prompt and response tokens."""
    return sum(prompt_lens) + sum(response_lens)


def split_by_tokens(prompt_lens: list[int], response_lens: list[int], max_tokens: int) -> list[list[int]]:
    """Greedy first-fit-decreasing packing: every micro-batch's packed tokens ≤ ``max_tokens``.

    A single row longer than the budget gets a micro-batch of its own (validation rule R10 keeps
    ``maxTokenLenPerGPU ≥ maxPromptLength + maxResponseLength``, so this does not happen in a valid run).
    Indices inside a micro-batch are ascending; micro-batches are ordered by their first index (:func:`micro_batches`
    runs them largest first).
    """
    order = sorted(range(len(prompt_lens)), key=lambda i: (-(prompt_lens[i] + response_lens[i]), i))
    bins: list[list[int]] = []
    for i in order:
        for members in bins:
            cand = [*members, i]
            if bin_cost([prompt_lens[j] for j in cand], [response_lens[j] for j in cand]) <= max_tokens:
                members.append(i)
                break
        else:
            bins.append([i])
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def equalize(bins: list[list[int]], count: int) -> list[list[int]]:
    """Split the largest micro-batches until there are ``count`` of them, so that every data-parallel rank runs the
    same number of forward/backward passes (FSDP's collectives must match). Splitting never raises a micro-batch's
    token count. When every micro-batch is a single row, empty ones are appended: the caller runs them as a
    zero-weight pass on a dummy row."""
    bins = [list(b) for b in bins]
    while len(bins) < count:
        largest = max(range(len(bins)), key=lambda k: len(bins[k]), default=None)
        if largest is None or len(bins[largest]) < 2:
            bins.append([])
            continue
        members = bins.pop(largest)
        half = len(members) // 2
        bins[largest:largest] = [members[:half], members[half:]]
    return bins


def largest_first(rows: Rows, bins: list[list[int]]) -> list[list[int]]:
    """``bins`` ordered by their packed tokens, largest first (ties keep their order, empty ones go last).

    Every later micro-batch's tensors then fit the blocks the first one freed, so PyTorch's caching allocator
    splits cached segments instead of reserving new ones. Run the other way, a larger micro-batch after a smaller
    one (or after the first backward, whose gradients pin pieces of the cached segments) reserves segments of its
    own: 28 GiB beyond the allocated peak on an H100 and 13.7 GiB in one H200 step, against 3.5 GiB largest first
    (Qwen2-0.5B, docs/performance.md).
    """
    prompt_len, response_len = lengths(rows)
    tokens = (prompt_len + response_len).tolist()
    return sorted(bins, key=lambda members: -sum(tokens[i] for i in members))


def micro_batches(rows: Rows, *, micro_batch_size: int | None, max_tokens: int | None) -> list[list[int]]:
    """Row indices of each micro-batch, largest first (:func:`largest_first`): fixed-size when
    ``micro_batch_size`` is set, else by the token budget."""
    if micro_batch_size is not None:
        bins = split_fixed(num_rows(rows), micro_batch_size)
    elif max_tokens is None:
        raise ValueError("set either micro_batch_size or max_tokens")
    else:
        prompt_len, response_len = lengths(rows)
        bins = split_by_tokens(prompt_len.tolist(), response_len.tolist(), max_tokens)
    return largest_first(rows, bins)


def shard_mini_batches(rows: Rows, *, mini_batch_rows: int, dp: int) -> list[list[Rows]]:
    """For every rank, its slice of every mini-batch: ``result[rank][j]`` holds ``mini_batch_rows / dp`` rows of
    mini-batch ``j``. Mini-batches are consecutive rows (a prompt's samples stay together), as in verl."""
    n = num_rows(rows)
    if n % mini_batch_rows or mini_batch_rows % dp:
        raise ValueError(f"{n} rows do not split into mini-batches of {mini_batch_rows} rows over {dp} ranks")
    per_rank = mini_batch_rows // dp
    result: list[list[Rows]] = [[] for _ in range(dp)]
    for start in range(0, n, mini_batch_rows):
        for rank in range(dp):
            lo = start + rank * per_rank
            result[rank].append(slice_rows(rows, lo, lo + per_rank))
    return result


def shard_rows(rows: Rows, dp: int) -> list[Rows]:
    """Consecutive, equal shares of the rows for forward-only passes (verl's ``DataProto.chunk``)."""
    n = num_rows(rows)
    if n % dp:
        raise ValueError(f"{n} rows do not split evenly over {dp} ranks")
    per = n // dp
    return [slice_rows(rows, r * per, (r + 1) * per) for r in range(dp)]
