"""The trainer's kuberl subcommands: argparse wiring, refusal of invalid specs, data, stats, export, plot."""

import json
from pathlib import Path

import torch
import yaml

from kuberl.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny://llama?hidden=32&layers=1&heads=2&kv_heads=1&seed=0"


def test_trainer_subcommands_are_registered():
    parser = build_parser()
    args = parser.parse_args(["run", "job.yaml", "--address", "ray://x:10001", "--run-dir", "out", "--steps", "3"])
    assert (args.file, args.address, args.run_dir, args.steps) == ("job.yaml", "ray://x:10001", "out", 3)
    assert parser.parse_args(["export", "ckpt", "out"]).checkpoint == "ckpt"
    assert parser.parse_args(["plot", "runs/x"]).run_dir == "runs/x"
    data = parser.parse_args(
        ["data", "gsm8k-synth", "--out", "f.parquet", "--n", "5", "--seed", "2", "--split", "test"]
    )
    assert (data.task, data.out, data.n, data.seed, data.split) == ("gsm8k-synth", "f.parquet", 5, 2, "test")
    stats = parser.parse_args(["stats", "a.parquet", "b.jsonl", "--tokenizer", "smollm2"])
    assert stats.files == ["a.parquet", "b.jsonl"] and stats.tokenizer == "smollm2"


def test_importing_commands_pulls_in_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys, kuberl.trainer.commands; "
        "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_run_refuses_an_invalid_spec_naming_the_field(tmp_path, capsys):
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["batch"]["ppoMiniBatchSize"] = 32  # larger than trainBatchSize 16
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path)]) == 1
    err = capsys.readouterr().err
    assert "is invalid" in err and "spec.batch" in err and "ppoMiniBatchSize" in err


def test_run_reports_a_missing_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_data_digits_writes_rows(tmp_path):
    out = tmp_path / "d.parquet"
    assert main(["data", "digits", "--out", str(out), "--n", "7", "--seed", "1"]) == 0
    from kuberl.trainer.data import load_rows

    rows = load_rows([str(out)])
    assert len(rows) == 7 and rows[0]["data_source"] == "kuberl/digits"


def test_data_gsm8k_synth_writes_rows(tmp_path):
    out = tmp_path / "g.jsonl"
    assert main(["data", "gsm8k-synth", "--out", str(out), "--n", "3", "--split", "test"]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_stats_prints_the_length_report(tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    main(["data", "digits", "--out", str(out), "--n", "20"])
    capsys.readouterr()
    assert main(["stats", str(out), "--tokenizer", TINY]) == 0
    assert "maxPromptLength" in capsys.readouterr().out


def make_checkpoint(root: Path) -> tuple[Path, dict]:
    from kuberl.trainer import checkpoint as ckpt
    from kuberl.trainer.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(TINY, torch.float32)
    folder = ckpt.step_dir(root, 3)
    actor = folder / "actor"
    (actor / "hf").mkdir(parents=True)
    state = {k: v.clone() + 0.5 for k, v in model.state_dict().items()}
    torch.save(state, actor / "model.pt")
    (actor / "lora.json").write_text("{}")
    model.config.save_pretrained(actor / "hf")
    load_tokenizer(TINY).save_pretrained(actor / "hf")
    ckpt.write_state(folder, {"step": 3})
    ckpt.mark_latest(root, folder)
    return folder, state


def test_export_writes_a_loadable_hugging_face_folder(tmp_path):
    from kuberl.trainer.models import load_causal_lm

    _, state = make_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "ckpt"), str(out)]) == 0  # the checkpointDir: its latest checkpoint
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    reloaded = load_causal_lm(str(out), torch.float32)
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, state[name])


def test_export_refuses_a_folder_without_checkpoints(tmp_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "neither" in capsys.readouterr().err


def test_plot_writes_metrics_png(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "critic/score/mean": s / 10, "perf/throughput": 5.0}) + "\n" for s in (1, 2))
    )
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "metrics.png").stat().st_size > 1000


def test_plot_without_metrics_is_an_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 1
    assert "metrics.jsonl" in capsys.readouterr().err


def test_module_entrypoint_refuses_an_invalid_spec_file(tmp_path, capsys):
    from kuberl.trainer.run import main as run_main

    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "model": {"path": TINY},
                "data": {"trainFiles": ["x.parquet"]},
                "batch": {"trainBatchSize": 2, "ppoMiniBatchSize": 4},
            }
        )
    )
    assert run_main(["--spec-file", str(spec), "--name", "x"]) == 1
    assert "ppoMiniBatchSize" in capsys.readouterr().err


def test_run_reports_missing_data_without_a_traceback(tmp_path, capsys):
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["data"]["trainFiles"] = [str(tmp_path / "missing.parquet")]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run")]) == 1
    assert "missing.parquet: data file does not exist" in capsys.readouterr().err


def test_stats_with_an_unknown_tokenizer_is_a_message_not_a_traceback(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "none.parquet"), "--tokenizer", "Qwen/Qwen2.5-0.5B-Instruct"]) == 2
    assert "error: model path 'Qwen/Qwen2.5-0.5B-Instruct' does not exist" in capsys.readouterr().err


def test_stats_with_a_missing_data_file_is_a_message(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "none.parquet"), "--tokenizer", TINY]) == 2
    assert "none.parquet: data file does not exist" in capsys.readouterr().err
