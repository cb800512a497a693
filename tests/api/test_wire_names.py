"""Documents are read by wire names only; Python code may still build specs by field name."""

from __future__ import annotations

import pytest

from kuberl.api.spec import Batch, Data, Model, RLJobSpec
from kuberl.api.validation import validate_document
from tests.api.mutations import all_documents

SNAKE_CASE = [(name, doc) for name, doc in all_documents() if ":snake:" in name]


@pytest.mark.parametrize(("name", "doc"), SNAKE_CASE, ids=[n for n, _ in SNAKE_CASE])
def test_every_snake_case_name_is_refused_with_its_wire_name(name: str, doc: dict) -> None:
    snake = name.rsplit(".", 1)[-1]
    issues = [i for i in validate_document(doc) if i.field.endswith("." + snake)]
    assert issues and "did you mean" in issues[0].message, validate_document(doc)


def test_python_code_builds_a_spec_by_field_name() -> None:
    spec = RLJobSpec(
        model=Model(path="/m"),
        data=Data(train_files=["/d.parquet"]),
        batch=Batch(train_batch_size=8, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=1),
    )
    assert spec.batch.train_batch_size == 8
