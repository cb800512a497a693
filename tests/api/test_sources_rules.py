"""Which model and data sources admission accepts: what the trainer can load, and nothing else."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kuberl.api import validate_document
from tests.api.cases import BASE
from tests.api.crd_eval import refused_fields


def with_sources(model: str, data: str) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"]["model"]["path"] = model
    doc["spec"]["data"]["trainFiles"] = [data]
    return doc


ACCEPTED = [
    ("/models/policy", "/data/train.parquet"),
    ("./Qwen/Qwen2.5-7B-Instruct", "examples/data/digits-train.parquet"),
    ("~/models/policy", "~/data/train.jsonl"),
    ("models/smollm2.gguf", "train.json"),
    ("hf://Qwen/Qwen2.5-7B-Instruct", "hf://datasets/openai/gsm8k/main/train-00000-of-00001.parquet"),
    ("hf://Qwen/Qwen2.5-7B-Instruct@a09a3545", "hf://datasets/openai/gsm8k@refs%2Fconvert%2Fparquet/train.parquet"),
    ("s3://models/qwen/", "s3://data/gsm8k/train.parquet"),
    ("smollm2", "/data/train.parquet"),
    ("tiny://llama?hidden=64&layers=2", "/data/train.parquet"),
]

REFUSED_MODELS = [
    "Qwen/Qwen2.5-7B-Instruct",
    "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct",
    "gs://b/m",
    "hf://Qwen",
]
REFUSED_DATA = ["https://x.org/train.parquet", "gs://b/train.parquet", "hf://openai/gsm8k/train.parquet", "s3://b"]


@pytest.mark.parametrize(("model", "data"), ACCEPTED)
def test_loadable_sources_are_admitted_offline_and_by_the_crd(model: str, data: str) -> None:
    doc = with_sources(model, data)
    assert validate_document(doc) == []
    assert refused_fields(doc) == {}


@pytest.mark.parametrize("model", REFUSED_MODELS)
def test_unloadable_model_paths_are_refused_with_the_sources_named(model: str) -> None:
    doc = with_sources(model, "/data/train.parquet")
    (issue,) = validate_document(doc)
    assert issue.field == "spec.model.path"
    assert "hf://ORG/NAME" in issue.message and "s3://BUCKET/PREFIX" in issue.message
    assert refused_fields(doc) == {"spec.model.path": issue.message}


def test_a_bare_hub_id_is_told_its_hf_spelling() -> None:
    (issue,) = validate_document(with_sources("Qwen/Qwen2.5-7B-Instruct", "/data/train.parquet"))
    assert issue.message.endswith("; for the hub model write hf://Qwen/Qwen2.5-7B-Instruct")


@pytest.mark.parametrize("data", REFUSED_DATA)
def test_unreadable_data_files_are_refused_naming_the_entry(data: str) -> None:
    doc = with_sources("/models/policy", data)
    (issue,) = validate_document(doc)
    assert issue.field == "spec.data.trainFiles"
    assert f"entry {data} is not a file the trainer can read" in issue.message
    assert refused_fields(doc) == {"spec.data.trainFiles": issue.message}
