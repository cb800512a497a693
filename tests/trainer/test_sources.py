"""Remote model and data sources against real servers: an S3-compatible server (moto) on 127.0.0.1 and a
pre-populated Hugging Face hub cache read with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kuberl.trainer.data.prompts import DataError, load_rows
from kuberl.trainer.data.tasks import digit_copy, write_rows
from kuberl.trainer.model.loading import (
    ModelNotFoundError,
    build_tiny,
    load_causal_lm,
    load_tokenizer,
    parse_tiny,
    resolve,
    tiny_tokenizer,
)
from kuberl.trainer.model.shape import model_shape
from kuberl.trainer.observe.metrics import read_jsonl
from tests.trainer.kuberl_cli import REPO, cli_env, run_command

TINY = "tiny://llama?hidden=32&layers=1&heads=2&kv_heads=1&seed=3"


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """A real S3 API (moto's server) on a free loopback port, with two buckets."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """An s3fs client of the server; the trainer finds it through the standard AWS variables."""
    import s3fs

    for key, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "KUBERL_CACHE_DIR": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(key, value)
    fs = s3fs.S3FileSystem(endpoint_url=s3_server, key="test", secret="test", skip_instance_cache=True)
    for bucket in ("data", "models"):
        if not fs.exists(bucket):
            fs.mkdir(bucket)
    return fs


def save_tiny(folder: Path) -> Any:
    model = build_tiny(parse_tiny(TINY), __import__("transformers").AutoModelForCausalLM, torch.float32)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def test_load_rows_reads_parquet_and_jsonl_from_s3(s3: Any, tmp_path: Path) -> None:
    rows = digit_copy(5, seed=0, split="train")
    s3.put(str(write_rows(rows, str(tmp_path / "t.parquet"))), "data/digits/train.parquet")
    s3.put(str(write_rows(rows[:2], str(tmp_path / "v.jsonl"))), "data/digits/val.jsonl")
    loaded = load_rows(["s3://data/digits/train.parquet", "s3://data/digits/val.jsonl"])
    assert loaded == rows + rows[:2]


def test_a_missing_s3_object_is_a_data_error_naming_it(s3: Any) -> None:
    with pytest.raises(DataError, match=re.escape("s3://data/nothing.parquet: no such object")):
        load_rows(["s3://data/nothing.parquet"])


def test_a_wrong_endpoint_is_a_data_error_naming_the_endpoint(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(DataError, match=r"cannot read from S3 \(http://127.0.0.1:9\)"):
        load_rows(["s3://data/digits/train.parquet"])


def test_an_s3_model_folder_loads_with_the_same_weights_and_is_fetched_once(s3: Any, tmp_path: Path) -> None:
    original = save_tiny(tmp_path / "tiny")
    s3.put(str(tmp_path / "tiny"), "models/tiny", recursive=True)
    folder = Path(resolve("s3://models/tiny/"))
    assert (folder / "config.json").is_file() and folder.is_relative_to(tmp_path / "cache")
    loaded = load_causal_lm("s3://models/tiny", torch.float32)
    for (name, a), (_, b) in zip(original.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert load_tokenizer("s3://models/tiny").encode("a1") == tiny_tokenizer().encode("a1")
    assert resolve("s3://models/tiny") == str(folder)  # cached: same objects, same copy
    assert model_shape("s3://models/tiny").hidden == 32


def test_a_replaced_s3_model_is_fetched_again(s3: Any, tmp_path: Path) -> None:
    save_tiny(tmp_path / "tiny")
    s3.put(str(tmp_path / "tiny"), "models/replaced", recursive=True)
    first = resolve("s3://models/replaced")
    s3.pipe("models/replaced/README.md", b"a new revision\n")
    second = resolve("s3://models/replaced")
    assert first != second and (Path(second) / "README.md").read_text() == "a new revision\n"


def test_an_empty_s3_prefix_is_a_model_error(s3: Any) -> None:
    with pytest.raises(ModelNotFoundError, match="s3://models/absent: no objects under this prefix"):
        resolve("s3://models/absent")


# hf://: a hub cache laid out as huggingface_hub writes it, read offline


def hub_repo(cache: Path, kind: str, repo: str, files: dict[str, bytes], revision: str = "main") -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    for name, content in files.items():
        path = root / "snapshots" / commit / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_an_hf_model_loads_from_the_hub_cache_offline(hub: Path, tmp_path: Path) -> None:
    original = save_tiny(tmp_path / "tiny")
    hub_repo(hub, "model", "kuberl/tiny", {p.name: p.read_bytes() for p in (tmp_path / "tiny").iterdir()})
    assert Path(resolve("hf://kuberl/tiny")).is_relative_to(hub)
    loaded = load_causal_lm("hf://kuberl/tiny", torch.float32)
    assert torch.equal(loaded.model.embed_tokens.weight, original.model.embed_tokens.weight)
    assert model_shape("hf://kuberl/tiny").layers == 1


def test_an_hf_model_missing_from_the_cache_offline_says_so(hub: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"hf://Qwen/Qwen2.5-7B-Instruct: not in the hub cache .* HF_HUB_OFF"):
        resolve("hf://Qwen/Qwen2.5-7B-Instruct")


def test_an_hf_dataset_file_is_read_from_the_hub_cache_offline(hub: Path, tmp_path: Path) -> None:
    rows = digit_copy(3, seed=1, split="test")
    data = write_rows(rows, str(tmp_path / "test.parquet")).read_bytes()
    hub_repo(hub, "dataset", "kuberl/digits", {"main/test.parquet": data})
    assert load_rows(["hf://datasets/kuberl/digits/main/test.parquet"]) == rows
    with pytest.raises(
        DataError, match=re.escape("hf://datasets/kuberl/digits/main/train.parquet: not in the hub cache")
    ):
        load_rows(["hf://datasets/kuberl/digits/main/train.parquet"])


def test_a_bare_hub_id_that_is_no_local_folder_is_told_its_hf_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match=re.escape("write hf://Qwen/Qwen2.5-7B-Instruct")):
        resolve("Qwen/Qwen2.5-7B-Instruct")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kuberl_run_trains_a_step_on_model_and_data_read_from_s3(s3: Any, tmp_path: Path) -> None:
    """The whole path on the cluster's terms: driver and Ray workers each fetch from the S3 endpoint. The run
    folder then feeds `kuberl plot` (titled with the RLJob's name) and `kuberl export` (its latest checkpoint)."""
    import subprocess

    import yaml

    save_tiny(tmp_path / "tiny")
    s3.put(str(tmp_path / "tiny"), "models/run-policy", recursive=True)
    write_rows(digit_copy(16, seed=0, split="train"), str(tmp_path / "train.parquet"))
    s3.put(str(tmp_path / "train.parquet"), "data/run/train.parquet")
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["model"]["path"] = "s3://models/run-policy"
    doc["spec"]["data"].update(trainFiles=["s3://data/run/train.parquet"], valFiles=[])
    doc["spec"]["trainer"].update(totalSteps=1, testFreq=0, saveFreq=1, checkpointDir=str(tmp_path / "ckpt"))
    doc["spec"]["trainer"]["metricsPort"] = 0
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    env = cli_env()
    result = subprocess.run(
        run_command(str(tmp_path / "job.yaml"), str(tmp_path / "run")),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "critic/score/mean" in r]
    assert [r["step"] for r in records] == [1]

    from kuberl.cli import main
    from kuberl.trainer.observe.plot import figure, read_records, run_record

    assert main(["plot", str(tmp_path / "run")]) == 0
    fig = figure(read_records(tmp_path / "run" / "metrics.jsonl"), run_record(tmp_path / "run"), tmp_path / "run")
    assert fig._suptitle.get_text().startswith("RLJob tiny-cpu")
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "hf"), "--dtype", "float32"]) == 0
    assert load_causal_lm(str(tmp_path / "hf"), torch.float32).config.hidden_size == 32


def test_kuberl_run_with_a_missing_s3_data_file_is_a_message(s3: Any, tmp_path: Path, capsys: Any) -> None:
    import yaml

    from kuberl.cli import main

    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["data"].update(trainFiles=["s3://data/run/absent.parquet"], valFiles=[])
    doc["spec"]["trainer"].update(testFreq=0)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    assert main(["run", str(tmp_path / "job.yaml"), "--run-dir", str(tmp_path / "run")]) == 1
    assert "error: s3://data/run/absent.parquet: no such object" in capsys.readouterr().err


def test_kuberl_stats_reads_s3_data(s3: Any, tmp_path: Path, capsys: Any) -> None:
    from kuberl.cli import main

    s3.put(str(write_rows(digit_copy(20, seed=0, split="train"), str(tmp_path / "d.parquet"))), "data/stats.parquet")
    assert main(["stats", "s3://data/stats.parquet", "--tokenizer", TINY]) == 0
    assert "maxPromptLength" in capsys.readouterr().out
