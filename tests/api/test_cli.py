"""`kuberl validate`, `kuberl crd --check` and `kuberl docs --check` as a user runs them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from kuberl.cli import main
from tests.api.cases import BASE, INVALID_CASES

ROOT = Path(__file__).resolve().parents[2]


def test_valid_example_prints_derived_quantities(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "examples/gsm8k-grpo.yaml")]) == 0
    out = capsys.readouterr().out
    assert "is valid" in out and "gradient-accumulation steps" in out and "responses per step" in out


def test_invalid_document_exits_one_and_names_every_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([BASE, INVALID_CASES[0].document, INVALID_CASES[1].document]))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}#1: RLJob base is valid" in out
    assert INVALID_CASES[0].field in out and INVALID_CASES[1].field in out


def test_json_output_lists_issues_and_derived_quantities(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = copy.deepcopy(BASE)
    bad["spec"]["batch"]["ppoMicroBatchSizePerGPU"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["validate", "-o", "json", str(path), str(ROOT / "examples/tiny-cpu.yaml")]) == 1
    results = json.loads(capsys.readouterr().out)
    assert results[0]["valid"] is False
    assert results[0]["issues"][0]["field"] == "spec.batch.ppoMicroBatchSizePerGPU"
    assert results[1]["valid"] is True and results[1]["derived"]["trainer_gpus"] == 1


def test_unreadable_file_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_broken_yaml_is_an_error_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("spec: [unclosed\n")
    assert main(["validate", str(path)]) == 2
    assert "broken.yaml: not valid YAML" in capsys.readouterr().err


def test_crd_check_detects_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "rljob.yaml"
    stale.write_text("old\n")
    assert main(["crd", "--check", "--output", str(stale)]) == 1
    assert main(["crd", "--output", str(stale)]) == 0
    assert main(["crd", "--check", "--output", str(stale)]) == 0
