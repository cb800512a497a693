"""The trainer's kuberl subcommands: argparse wiring, refusal of invalid specs, data, stats, export, plot."""

import json
import shutil
from pathlib import Path

import torch
import yaml

from kuberl.api.contract import EXIT_PERMANENT
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
        ["data", "gsm8k-synth", "--output-file", "f.parquet", "--n", "5", "--seed", "2", "--split", "test"]
    )
    assert (data.task, data.output_file, data.n, data.seed, data.split) == ("gsm8k-synth", "f.parquet", 5, 2, "test")
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
    assert main(["data", "digits", "--output-file", str(out), "--n", "7", "--seed", "1"]) == 0
    from kuberl.trainer.data.prompts import load_rows

    rows = load_rows([str(out)])
    assert len(rows) == 7 and rows[0]["data_source"] == "kuberl/digits"


def test_data_gsm8k_synth_writes_rows(tmp_path):
    out = tmp_path / "g.jsonl"
    assert main(["data", "gsm8k-synth", "--output-file", str(out), "--n", "3", "--split", "test"]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_data_arithmetic_writes_the_requested_layout(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    assert main(["data", "arithmetic", "--layout", "short", "--output-file", str(out), "--n", "4"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"][0]["content"] for r in rows] == [r["extra_info"]["expression"] for r in rows]
    assert main(["data", "digits", "--layout", "short", "--output-file", str(out)]) == 1
    assert "--layout shapes arithmetic problems; the digits task takes none" in capsys.readouterr().err


def test_stats_prints_the_length_report(tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    main(["data", "digits", "--output-file", str(out), "--n", "20"])
    capsys.readouterr()
    assert main(["stats", str(out), "--tokenizer", TINY]) == 0
    assert "maxPromptLength" in capsys.readouterr().out


def make_checkpoint(root: Path) -> tuple[Path, dict]:
    import torch.distributed.checkpoint as dcp

    from kuberl.trainer.checkpoint import files as ckpt
    from kuberl.trainer.model.loading import load_causal_lm, load_tokenizer
    from tests.trainer.test_checkpoint import seal

    model = load_causal_lm(TINY, torch.float32)
    folder = ckpt.step_dir(root, 3)
    actor = folder / "actor"
    (actor / "hf").mkdir(parents=True)
    state = {k: v.clone() + 0.5 for k, v in model.state_dict().items()}
    dcp.save(state, checkpoint_id=actor / "model", no_dist=True)
    (actor / "lora.json").write_text("{}")
    model.config.save_pretrained(actor / "hf")
    load_tokenizer(TINY).save_pretrained(actor / "hf")
    seal(folder, 3)
    ckpt.mark_latest(root, folder)
    return folder, state


def test_export_writes_a_loadable_hugging_face_folder_in_the_dtype_asked(tmp_path):
    from kuberl.trainer.model.loading import load_causal_lm

    _, state = make_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "ckpt"), str(out), "--dtype", "float32"]) == 0  # its latest checkpoint
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    reloaded = load_causal_lm(str(out), torch.float32)
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, state[name])


def test_export_defaults_to_bfloat16(tmp_path):
    from safetensors import safe_open

    make_checkpoint(tmp_path / "ckpt")
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (not a dict)


def test_export_shards_with_an_index_and_readable_permissions(tmp_path):
    import os

    make_checkpoint(tmp_path / "ckpt")
    old = os.umask(0o022)
    try:
        assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--max-shard-size", "20KB"]) == 0
    finally:
        os.umask(old)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((tmp_path / "hf" / s).is_file() for s in shards)
    assert {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "hf").iterdir()} == {"0o644"}


def test_export_refuses_to_overwrite_without_force(tmp_path, capsys):
    make_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(tmp_path / "ckpt"), str(out)]) == 1
    assert "exists; pass --force" in capsys.readouterr().err and (out / "keep.txt").exists()
    assert main(["export", str(tmp_path / "ckpt"), str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()


def test_export_accepts_a_run_folder_and_picks_its_latest_checkpoint(tmp_path, capsys):
    from kuberl.trainer.checkpoint import files as ckpt
    from kuberl.trainer.observe.metrics import write_run_record

    make_checkpoint(tmp_path / "elsewhere" / "ckpt")
    newer = ckpt.step_dir(tmp_path / "elsewhere" / "ckpt", 7)
    shutil.copytree(ckpt.step_dir(tmp_path / "elsewhere" / "ckpt", 3), newer)
    ckpt.mark_latest(tmp_path / "elsewhere" / "ckpt", newer)
    write_run_record(
        tmp_path / "run", "tiny", "default", {"trainer": {"checkpointDir": str(tmp_path / "elsewhere" / "ckpt")}}
    )
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    assert "global_step_7" in capsys.readouterr().out


def test_export_refuses_a_folder_without_checkpoints(tmp_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 1
    assert "holds no complete checkpoint" in capsys.readouterr().err


def test_export_refuses_an_incomplete_checkpoint(tmp_path, capsys):
    folder, _ = make_checkpoint(tmp_path / "ckpt")
    (folder / "manifest.json").unlink()  # the manifest is written last: without it the save was cut off
    assert main(["export", str(folder), str(tmp_path / "out")]) == 1
    assert "incomplete checkpoint" in capsys.readouterr().err


def test_export_of_a_missing_folder_is_a_message(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "out")]) == 1
    assert "nope does not exist" in capsys.readouterr().err


def test_export_of_a_truncated_checkpoint_is_a_message(tmp_path, capsys):
    folder, _ = make_checkpoint(tmp_path / "ckpt")
    model = folder / "actor" / "model" / "__0_0.distcp"
    model.write_bytes(model.read_bytes()[:1000])
    assert main(["export", str(folder), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "error: cannot export" in err and "truncated" in err and not (tmp_path / "out").exists()


def write_metrics(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plot_writes_metrics_png(tmp_path):
    write_metrics(tmp_path, [{"step": s, "critic/score/mean": s / 10, "perf/throughput": 5.0} for s in (1, 2)])
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "metrics.png").stat().st_size > 1000
    assert main(["plot", str(tmp_path), "--output-file", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").is_file()


def test_plot_without_metrics_is_an_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 1
    assert "metrics.jsonl" in capsys.readouterr().err


def test_plot_of_a_corrupt_metrics_file_is_a_message(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "critic/sc\n{"step": 3}\n')
    assert main(["plot", str(tmp_path)]) == 1
    assert "metrics.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_plot_leaves_out_the_cut_off_last_line_of_a_killed_run(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "critic/score/mean": 0.1}\n{"step": 2, "critic/sc')
    assert main(["plot", str(tmp_path)]) == 0


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
    assert run_main(["--spec-file", str(spec), "--name", "x"]) == EXIT_PERMANENT  # a retry cannot fix a spec
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


def subcommands() -> dict:
    import argparse

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_flag_of_every_subcommand_has_help():
    import argparse

    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, parser in subcommands().items()
        for action in parser._actions
        if not action.help or (action.help == argparse.SUPPRESS and not action.option_strings)
    ]
    assert missing == []


def test_output_is_a_format_and_output_file_a_path_everywhere():
    import argparse

    for name, parser in subcommands().items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # an old spelling kept for scripts
            if "--output" in action.option_strings:
                # a report's format, or a manifest's as kubectl's -o (import-verl writes an RLJob)
                assert action.choices in (("text", "json"), ("yaml", "json")), name
                assert "-o" in action.option_strings, name
            if action.dest == "output_file":
                assert action.option_strings == ["--output-file"], name


def test_data_to_an_unwritable_place_is_a_message(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["data", "digits", "--output-file", str(tmp_path / "file" / "d.parquet"), "--n", "2"]) == 1
    assert "error:" in capsys.readouterr().err


def test_data_with_an_unknown_suffix_is_a_message(tmp_path, capsys):
    assert main(["data", "digits", "--output-file", str(tmp_path / "d.csv"), "--n", "2"]) == 1
    assert "write .parquet or .jsonl" in capsys.readouterr().err


def test_data_keeps_the_old_out_spelling(tmp_path):
    assert main(["data", "digits", "--out", str(tmp_path / "d.jsonl"), "--n", "2"]) == 0
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 2


def test_run_of_a_missing_file_is_a_message(tmp_path, capsys):
    assert main(["run", str(tmp_path / "job.yaml")]) == 2
    assert "job.yaml" in capsys.readouterr().err


def test_plan_of_a_missing_file_is_a_message(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "job.yaml")]) == 2
    assert "job.yaml" in capsys.readouterr().err


def test_plan_with_an_unknown_gpu_is_a_message(capsys):
    assert main(["plan", str(REPO / "examples" / "gsm8k-grpo.yaml"), "--gpu", "Z9000"]) == 2
    assert "Z9000" in capsys.readouterr().err
