"""`kuberl validate`, `kuberl crd --check` and `kuberl docs --check` as a user runs them."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
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
    assert main(["crd", "--check", "--output-file", str(stale)]) == 1
    assert main(["crd", "--output-file", str(stale)]) == 0
    assert main(["crd", "--check", "--output-file", str(stale)]) == 0


def _write(tmp_path: Path, *docs: object, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return str(path)


def test_snake_case_field_is_refused_with_its_wire_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["trainer"] = {"total_steps": 40}
    assert main(["validate", _write(tmp_path, doc)]) == 1
    assert "spec.trainer.total_steps: unknown field; did you mean 'totalSteps'?" in capsys.readouterr().out


def test_number_written_as_a_string_is_refused_as_the_apiserver_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["batch"]["trainBatchSize"] = "64"
    assert main(["validate", _write(tmp_path, doc)]) == 1
    assert "spec.batch.trainBatchSize: Input should be a valid integer" in capsys.readouterr().out


def test_other_kinds_are_skipped_and_the_rljob_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"}, "spec": {}}
    assert main(["validate", _write(tmp_path, claim, BASE)]) == 0
    out = capsys.readouterr().out
    assert "job.yaml#1: v1 PersistentVolumeClaim data skipped (not an RLJob)" in out
    assert "job.yaml#2: RLJob base is valid" in out


def test_a_file_without_rljob_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claim = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert main(["validate", _write(tmp_path, claim)]) == 2
    assert "no RLJob document" in capsys.readouterr().err


def test_empty_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("---\n")
    assert main(["validate", str(path)]) == 2
    assert "empty.yaml: holds no YAML document" in capsys.readouterr().err


def test_schema_and_rule_issues_are_reported_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["trainer"] = {"totalSteps": 0}
    doc["spec"]["batch"]["ppoMicroBatchSizePerGPU"] = 3
    assert main(["validate", _write(tmp_path, doc)]) == 1
    out = capsys.readouterr().out
    assert "(2 issues)" in out
    assert "spec.trainer.totalSteps: Input should be greater than or equal to 1" in out
    assert "spec.batch.ppoMicroBatchSizePerGPU:" in out and "[micro-batch-divides-mini-batch]" in out


def test_a_rule_reading_a_refused_value_is_not_evaluated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["batch"]["ppoMiniBatchSize"] = 0
    assert main(["validate", _write(tmp_path, doc)]) == 1
    out = capsys.readouterr().out
    assert "(1 issue)" in out and "spec.batch.ppoMiniBatchSize: Input should be greater than or equal to 1" in out


def test_exponent_without_a_dot_is_a_number_as_for_kubectl(tmp_path: Path) -> None:
    path = tmp_path / "lr.yaml"
    path.write_text(yaml.safe_dump(BASE) + "\n")
    text = path.read_text().replace("spec:\n", "spec:\n  actor: {optim: {lr: 1e-6}}\n", 1)
    path.write_text(text)
    assert main(["validate", str(path)]) == 0


def test_set_overrides_fields_by_wire_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, BASE)
    assert main(["validate", "-o", "json", path, "--set", "batch.trainBatchSize=32", "--set", "batch.rolloutN=8"]) == 0
    derived = json.loads(capsys.readouterr().out)[0]["derived"]
    assert derived["responses_per_step"] == 256


def test_set_with_a_snake_case_name_gets_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", _write(tmp_path, BASE), "--set", "batch.train_batch_size=32"]) == 1
    assert "did you mean 'trainBatchSize'?" in capsys.readouterr().out


def test_set_without_equals_is_an_error_naming_the_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", _write(tmp_path, BASE), "--set", "batch.trainBatchSize"]) == 2
    assert "--set 'batch.trainBatchSize': expected PATH=VALUE" in capsys.readouterr().err


def test_cpu_job_reports_ranks_not_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "examples/tiny-cpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "trainer ranks (CPU processes)" in out and "GPU" not in out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("kuberl ")


def test_crd_output_dash_writes_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["crd", "--output-file", "-"]) == 0
    assert "kind: CustomResourceDefinition" in capsys.readouterr().out and not (tmp_path / "-").exists()


def test_crd_check_outside_the_repo_says_the_file_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["crd", "--check"]) == 1
    err = capsys.readouterr().err
    assert "crds/rljob.yaml does not exist" in err and "stale" not in err


def test_the_old_output_spelling_of_crd_still_names_the_file(tmp_path: Path) -> None:
    assert main(["crd", "--output", str(tmp_path / "crd.yaml")]) == 0
    assert (tmp_path / "crd.yaml").read_text().startswith("# Generated by `kuberl crd`")


@pytest.mark.parametrize("command", ["crd", "docs"])
def test_an_unwritable_output_file_is_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    (tmp_path / "file").write_text("")
    assert main([command, "--output-file", str(tmp_path / "file" / "out.yaml")]) == 2
    assert f"error: cannot write {tmp_path / 'file' / 'out.yaml'}" in capsys.readouterr().err


def test_import_verl_to_an_unwritable_file_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "job.yaml"
    assert main(["import-verl", "data.train_batch_size=32", "--output-file", str(target)]) == 2
    assert f"error: cannot write {target}" in capsys.readouterr().err


def test_import_verl_of_a_missing_script_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import-verl", str(tmp_path / "run_qwen.sh")]) == 2
    assert "run_qwen.sh" in capsys.readouterr().err


def test_validate_of_a_missing_file_is_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "job.yaml")]) == 2
    assert "job.yaml" in capsys.readouterr().err


# --- the rough edges of issue 39 ---------------------------------------------------------------------------------


def test_validate_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((ROOT / "examples/tiny-cpu.yaml").read_text()))
    assert main(["validate", "-"]) == 0
    assert capsys.readouterr().out.startswith("<stdin>: RLJob tiny-cpu is valid")


def test_validate_checks_every_yaml_of_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "b.yml").write_text(yaml.safe_dump(INVALID_CASES[0].document))
    (tmp_path / "notes.txt").write_text("not a manifest")
    assert main(["validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'a.yaml'}: RLJob base is valid" in out and f"{tmp_path / 'b.yml'}: RLJob" in out
    assert "notes.txt" not in out


def test_validate_of_an_empty_folder_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path)]) == 2
    assert "a folder with no .yaml or .yml file" in capsys.readouterr().err


def test_a_yaml_error_names_the_file_not_unicode_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("spec:\n  batch: [unclosed\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f'in "{path}", line 3' in err and "<unicode string>" not in err


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("4GB", "'4GB' is not a Kubernetes quantity: write 4Gi (4 × 2^30 bytes) or 4G (4 × 10^9)"),
        ("512MiB", "'512MiB' is not a Kubernetes quantity: write 512Mi (512 × 2^20 bytes)"),
        ("lots", "'lots' is not a Kubernetes quantity: a number with an optional suffix"),
    ],
)
def test_a_quantity_with_bytes_says_the_spelling_to_use(
    value: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["validate", str(ROOT / "examples/tiny-cpu.yaml"), "--set", f"cluster.trainer.memory={value}"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert hint in out and "^([+-]?" not in out


@pytest.mark.parametrize("command", ["crd", "docs"])
def test_crd_and_docs_outside_a_checkout_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([command]) == 2
    assert "is not one (no charts/kuberl/Chart.yaml): run it in the repository root" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_output_cut_short_by_the_reader_ends_quietly() -> None:
    command = [sys.executable, "-m", "kuberl.cli", "docs", "--output-file", "-"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # `| head -0`: the reader is gone before the first line (Python starts in seconds)
    assert process.wait(timeout=120) == 141
    stderr = process.stderr.read().decode()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
