"""Prompt data in verl's schema: read rows, apply the chat template, batch them resumably.

A row: ``data_source``, ``prompt`` (a chat list ``[{"role", "content"}]``), ``ability``,
``reward_model`` = ``{"style", "ground_truth"}``, ``extra_info`` (a dict). Files are read whole into memory,
as verl does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

from kuberl.api.spec import Data
from kuberl.trainer.data.sources import SourceError, is_remote, read_bytes

SUFFIXES = (".parquet", ".jsonl", ".json")
REQUIRED_COLUMNS = ("data_source", "reward_model")


class DataError(ValueError):
    """A data file or row does not match the schema, or the data cannot fill one batch."""


def parse_rows(name: str, suffix: str, content: bytes) -> list[Any]:
    """The rows of a ``.parquet``, ``.jsonl`` or ``.json`` (a list of rows) file's ``content``."""
    if suffix == ".parquet":
        try:
            rows: list[Any] = pq.read_table(pa.BufferReader(content)).to_pylist()
        except pa.ArrowException as e:
            raise DataError(f"{name}: not a readable parquet file ({e})") from e
        return rows
    text = content.decode()
    if suffix == ".jsonl":
        rows = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{name}:{line_number}: not valid JSON ({e.msg})") from e
        return rows
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{name}:{e.lineno}: not valid JSON ({e.msg})") from e
    if not isinstance(rows, list):
        raise DataError(f"{name}: a .json data file holds a list of rows, found a {type(rows).__name__}")
    return rows


def read_file(name: str) -> list[Any]:
    """The rows of a local path, ``s3://`` object or ``hf://datasets/`` file."""
    suffix = PurePosixPath(name).suffix
    if suffix not in SUFFIXES:
        raise DataError(f"{name}: unsupported data file type {suffix!r}; use one of {SUFFIXES}")
    if is_remote(name):
        try:
            return parse_rows(name, suffix, read_bytes(name))
        except SourceError as e:
            raise DataError(str(e)) from e
    path = Path(name).expanduser()
    if not path.is_file():
        raise DataError(
            f"{name}: data file does not exist (check data.trainFiles / data.valFiles and the volume that holds them)"
        )
    return parse_rows(name, suffix, path.read_bytes())


def check_row(row: Any, where: str, prompt_key: str) -> None:
    if not isinstance(row, dict):
        raise DataError(f"{where}: a row is an object, found a {type(row).__name__}")
    for column in (*REQUIRED_COLUMNS, prompt_key):
        if column not in row or row[column] is None:
            raise DataError(f"{where}: missing column {column!r} (columns: {sorted(row)})")
    reward = row["reward_model"]
    if not isinstance(reward, dict) or (reward.get("style") != "model" and reward.get("ground_truth") is None):
        raise DataError(f"{where}: reward_model needs a 'ground_truth' (or style 'model'), found {reward!r}")


def load_rows_with_origins(paths: list[str], *, prompt_key: str = "prompt") -> tuple[list[dict[str, Any]], list[str]]:
    """All rows of ``paths`` (local, ``s3://`` or ``hf://datasets/``) in order, and where each came from
    (``file row N``), for errors found later."""
    rows: list[dict[str, Any]] = []
    origins: list[str] = []
    for name in paths:
        for number, row in enumerate(read_file(name)):
            where = f"{name} row {number}"
            check_row(row, where, prompt_key)
            rows.append(row)
            origins.append(where)
    return rows, origins


def load_rows(paths: list[str], *, prompt_key: str = "prompt") -> list[dict[str, Any]]:
    """All rows of ``paths`` in order (:func:`load_rows_with_origins` without the origins)."""
    return load_rows_with_origins(paths, prompt_key=prompt_key)[0]


@dataclass(frozen=True)
class Prompt:
    """One templated, tokenized prompt; ``index`` is its row's position in the loaded rows."""

    input_ids: list[int]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any]
    index: int
    raw_prompt: list[dict[str, str]] = field(repr=False)


def check_chat(chat: Any, where: str, prompt_key: str) -> list[dict[str, str]]:
    if (
        not isinstance(chat, list)
        or not chat
        or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in chat
        )
    ):
        raise DataError(
            f"{where}: {prompt_key!r} must be a non-empty chat list of "
            f"{{'role': str, 'content': str}}, found {chat!r:.200}"
        )
    return [{"role": m["role"], "content": m["content"]} for m in chat]


def ground_truth_text(value: Any) -> str:
    """A ground truth as the reward function compares it: its string form (``0`` is "0", not empty); None is ""."""
    return "" if value is None else str(value)


class PromptDataset:
    """Rows with the chat template applied (``add_generation_prompt=True``) and tokenized.

    Prompts longer than ``max_prompt_length`` tokens are dropped and counted in ``num_filtered`` when
    ``filter_overlong``; otherwise the first one is an error, naming its file and row when ``origins`` (from
    :func:`load_rows_with_origins`) says where each row came from.
    """

    def __init__(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int,
        filter_overlong: bool,
        origins: list[str] | None = None,
    ) -> None:
        where = origins or [f"row {i}" for i in range(len(rows))]
        chats = [check_chat(row.get(prompt_key), where[i], prompt_key) for i, row in enumerate(rows)]
        texts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
        token_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        self.prompts: list[Prompt] = []
        self.num_filtered = 0
        for index, (row, chat, ids) in enumerate(zip(rows, chats, token_ids, strict=True)):
            if len(ids) > max_prompt_length:
                if not filter_overlong:
                    raise DataError(
                        f"{where[index]}: prompt is {len(ids)} tokens after the chat template, longer than "
                        f"maxPromptLength {max_prompt_length}; raise data.maxPromptLength or set "
                        "data.filterOverlongPrompts"
                    )
                self.num_filtered += 1
                continue
            self.prompts.append(
                Prompt(
                    input_ids=list(ids),
                    data_source=row["data_source"],
                    ground_truth=ground_truth_text(row["reward_model"].get("ground_truth")),
                    extra_info=dict(row.get("extra_info") or {}),
                    index=index,
                    raw_prompt=chat,
                )
            )

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> Prompt:
        return self.prompts[i]


class PromptLoader:
    """Fixed-size batches, last partial batch dropped (verl's ``drop_last``), shuffled per epoch from
    ``(seed, epoch)`` so that any epoch's order can be rebuilt after a restart.

    ``state_dict()`` is the position of the next batch; after ``load_state_dict`` iteration continues there.
    Iterating yields the rest of the current epoch and then moves to the next.
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, *, seed: int, shuffle: bool = True) -> None:
        if batch_size < 1:
            raise DataError(f"batch size must be ≥ 1, got {batch_size}")
        if len(dataset) < batch_size:
            raise DataError(
                f"the data holds {len(dataset)} prompts ({dataset.num_filtered} overlong filtered), fewer "
                f"than one batch of data.trainBatchSize={batch_size}: add data, lower the batch size, or "
                "raise data.maxPromptLength"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.batch_in_epoch = 0
        self.trained_ahead: tuple[int, ...] = ()
        """Offsets from the position of prompts trained before it was saved (asynchronous training trains prompts
        out of order): the resumed run skips them."""

    def __len__(self) -> int:
        return len(self.dataset) // self.batch_size

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.dataset))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))

    def __iter__(self) -> Iterator[list[Prompt]]:
        """The rest of the current epoch; stops early when :meth:`next_batch` moved on to the next epoch."""
        epoch = self.epoch
        while self.epoch == epoch and self.batch_in_epoch < len(self):
            yield self.next_batch()
        if self.epoch == epoch:
            self.epoch += 1
            self.batch_in_epoch = 0

    def next_batch(self) -> list[Prompt]:
        """The batch at the current position, moving into the next epoch after the last one (extra generation
        rounds of dynamic sampling draw here, so the saved position counts them)."""
        if self.batch_in_epoch >= len(self):
            self.epoch += 1
            self.batch_in_epoch = 0
        start = self.batch_in_epoch * self.batch_size
        self.batch_in_epoch += 1
        return [self.dataset[int(i)] for i in self.order(self.epoch)[start : start + self.batch_size]]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not 0 <= state["batch_in_epoch"] <= len(self):
            raise DataError(
                f"loader state {state} is past the {len(self)} batches per epoch of this data; the data "
                "or batch size changed since the checkpoint"
            )
        self.epoch = state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        self.trained_ahead = tuple(state.get("trained_ahead", ()))


@dataclass(frozen=True)
class RunPrompts:
    """A run's prompts: the training loader over ``data.trainFiles`` and the validation prompts of
    ``data.valFiles`` (overlong ones always dropped there)."""

    loader: PromptLoader
    validation: list[Prompt]

    @classmethod
    def load(cls, data: Data, tokenizer: PreTrainedTokenizerBase, *, batch_size: int) -> RunPrompts:
        def dataset(files: list[str], filter_overlong: bool) -> PromptDataset:
            rows, origins = load_rows_with_origins(files, prompt_key=data.prompt_key)
            return PromptDataset(
                rows,
                tokenizer,
                prompt_key=data.prompt_key,
                max_prompt_length=data.max_prompt_length,
                filter_overlong=filter_overlong,
                origins=origins,
            )

        train = dataset(data.train_files, data.filter_overlong_prompts)
        loader = PromptLoader(train, batch_size, seed=data.seed, shuffle=data.shuffle)
        return cls(loader, dataset(data.val_files, True).prompts if data.val_files else [])

    def summary(self) -> str:
        dataset = self.loader.dataset
        return (
            f"{len(self.loader)} per epoch; {len(dataset)} prompts ({dataset.num_filtered} overlong filtered), "
            f"{len(self.validation)} validation prompts"
        )
