"""What the end-to-end GRPO benchmarks share (bench/grpo_bench.py), and TRL's micro-batch sweep: the RLJob each
side runs, kuberl's metrics as steps by phase, the tokens/s summary, the card's peak as NVML reads it."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import bench.grpo_bench as grpo_bench
import bench.grpo_vs_trl as grpo_vs_trl
from bench.grpo_bench import (
    DeviceMemory,
    kuberl_spec,
    kuberl_steps,
    measured,
    read_earlier,
    shape_folder,
    summarise,
    write_result,
)
from kuberl.api.validation import parse_spec


def _args(max_tokens: str) -> argparse.Namespace:
    return argparse.Namespace(
        max_tokens=max_tokens,
        micro_batch=32,
        prompts=32,
        group=8,
        max_prompt=256,
        max_response=256,
        seed=1,
        gpu_memory_utilization=0.3,
        lr=5e-6,
        steps=4,
    )


@pytest.mark.parametrize(
    ("max_tokens", "batch"),
    [
        ("auto", {"dynamicBatchSize": {"enabled": True}}),
        ("32768", {"dynamicBatchSize": {"enabled": True, "maxTokenLenPerGPU": 32768}}),
        ("0", {"ppoMicroBatchSizePerGPU": 32}),
    ],
)
def test_the_micro_batches_of_the_kuberl_side(max_tokens: str, batch: dict[str, Any]) -> None:
    doc = kuberl_spec(_args(max_tokens), "/models/m", "/data/train.parquet", gpu=True)
    assert {k: v for k, v in doc["spec"]["batch"].items() if k in batch} == batch
    parse_spec(doc["spec"])  # a valid RLJob


def test_the_overlapped_kuberl_side_is_one_step_off_on_a_separate_engine() -> None:
    spec = parse_spec(kuberl_spec(_args("auto"), "/models/m", "/data/train.parquet", True, "kuberl_overlap")["spec"])
    assert (spec.rollout.placement, spec.rollout.overlap) == ("separate", "oneStepOffPolicy")
    assert spec.algorithm.rollout_correction.enabled and spec.cluster.rollout is not None


@pytest.mark.parametrize(
    "side, staleness, partial",
    [("kuberl_async_k1", 1, False), ("kuberl_async_k2", 2, False), ("kuberl_async_k2_partial", 2, True)],
)
def test_the_async_kuberl_sides_run_separate_engines_at_their_staleness(
    side: str, staleness: int, partial: bool
) -> None:
    spec = parse_spec(kuberl_spec(_args("auto"), "/models/m", "/data/train.parquet", True, side)["spec"])
    assert (spec.rollout.placement, spec.rollout.overlap) == ("separate", "async")
    assert spec.rollout.staleness_limit == staleness and spec.rollout.calculate_log_probs
    assert spec.rollout.partial_rollouts == partial
    assert spec.algorithm.rollout_correction.enabled


def test_the_async_rows_are_compared_with_the_one_step_off_row() -> None:
    from bench.grpo_vs_trl import print_async_ratios

    result = {
        "kuberl_overlap": {"tokens_per_s": 1000.0},
        "kuberl_async_k1": {"tokens_per_s": 1200.0},
        "kuberl_async_k2": {"tokens_per_s": 1350.0},
        "kuberl_async_k2_partial": {"tokens_per_s": 1500.0},
    }
    print_async_ratios(result)
    assert result["ratio_kuberl_async_k1_vs_overlap"] == 1.2 and result["ratio_kuberl_async_k2_vs_overlap"] == 1.35
    assert result["ratio_kuberl_async_k2_partial_vs_overlap"] == 1.5


SYNC = {
    "step": 2,
    "perf/total_num_tokens": 76000,
    "timing_s/step": 4.0,
    "timing_s/gen": 2.0,
    "timing_s/reward": 0.1,
    "timing_s/update_actor": 1.2,
    "timing_s/adv": 0.05,
    "timing_s/update_weights": 0.1,
    "perf/max_memory_allocated_gb": 36.3,
    "perf/max_memory_reserved_gb": 47.5,
    "perf/alloc_retries": 0.0,
    "perf/engine_pool_gb": 23.5,
    "perf/max_inactive_split_gb": 6.2,
}


def test_kuberls_metrics_become_steps_by_phase() -> None:
    (step,) = kuberl_steps([{"step": 0, "val": 1.0}, SYNC], overlap=False)
    assert (step["tokens"], step["seconds"], step["tokens_per_s"]) == (76000, 4.0, 19000.0)
    assert step["trainer_gib"] == {"allocated": 36.3, "reserved": 47.5, "engine_pool": 23.5, "inactive_split": 6.2}
    assert step["alloc_retries"] == 0.0
    assert step["breakdown_s"] == {
        "generation": 2.0,
        "reward": 0.1,
        "log_probs": 0.0,
        "update": 1.25,
        "sync": 0.1,
        "idle": 0.0,
        "other": 0.55,
    }


def test_one_step_off_the_generation_ran_in_the_previous_step() -> None:
    overlapped = {**SYNC, "timing_s/gen_wait": 0.8, "timing_s/overlap": 2.1, "timing_s/gen": 2.9}
    (step,) = kuberl_steps([overlapped], overlap=True)
    assert step["breakdown_s"]["generation"] == 0.0 and step["breakdown_s"]["reward"] == 0.0
    assert step["breakdown_s"]["idle"] == 0.8 and step["overlap_s"] == 2.1
    assert step["breakdown_s"]["other"] == round(4.0 - 0.8 - 1.25 - 0.1, 3)


def _steps(seconds: list[float]) -> list[dict[str, Any]]:
    return [
        {"step": i + 1, "tokens": 1000, "seconds": s, "tokens_per_s": 1000 / s, "breakdown_s": {"update": s / 2}}
        for i, s in enumerate(seconds)
    ]


def test_tokens_per_second_leave_out_the_warm_up_and_the_steps_a_backlog_or_the_end_flatters() -> None:
    assert summarise(_steps([10, 2, 2, 1]))["tokens_per_s"] == round(3000 / 5, 1)
    one_step_off = summarise(_steps([10, 1, 2, 2, 1]), ahead=1)
    assert one_step_off["measured_steps"] == [3, 4] and one_step_off["tokens_per_s"] == 500.0
    assert one_step_off["phases_s"] == {"update": 1.0}
    k2 = summarise(_steps([10, 1, 1, 2, 4, 1, 1]), ahead=2)
    assert k2["measured_steps"] == [4, 5] and k2["tokens_per_s"] == round(2000 / 6, 1)
    with pytest.raises(ValueError, match="need at least 6 steps"):
        summarise(_steps([10, 1, 1, 1, 1]), ahead=2)


def test_a_side_whose_steps_alternate_is_measured_over_whole_cycles() -> None:
    # verl's colocate_async on the H200: a dear step, then a cheap one; one step of the window measured either half
    alternating = summarise(_steps([18.55, 3.47, 15.98, 3.50, 1.0]), ahead=1, cycle=2)
    assert alternating["measured_steps"] == [3, 4] and alternating["tokens_per_s"] == round(2000 / 19.48, 1)
    odd_window = summarise(_steps([18.55, 3.47, 15.98, 3.50, 16.0, 1.0]), ahead=1, cycle=2)
    assert odd_window["measured_steps"] == [3, 4]
    with pytest.raises(ValueError, match=r"need at least 5 steps.*whole cycles of 2 steps"):
        summarise(_steps([18.55, 3.47, 15.98, 3.50]), ahead=1, cycle=2)


def test_a_side_that_recorded_too_few_steps_says_so() -> None:
    assert measured({"steps": _steps([3, 2])}, 4)["error"] == "2 of 4 steps recorded"
    assert "tokens_per_s" in measured({"steps": _steps([3, 2, 2, 2]), "error": "exit code 1 at teardown"}, 4)


def test_the_cards_peak_is_the_largest_reading_and_each_process_its_own() -> None:
    memory = DeviceMemory()
    memory.before_bytes = 2**29
    for used, processes in [(10 * 2**30, {7: 2**30}), (30 * 2**30, {7: 5 * 2**30, 9: 20 * 2**30}), (12 * 2**30, {})]:
        memory.record(used, processes)
    recorded = memory.as_dict()
    assert recorded["device_peak_gib"] == 30.0 and recorded["device_before_gib"] == 0.5 and recorded["samples"] == 3
    assert recorded["process_peaks_gib"] == {"9": 20.0, "7": 5.0}


def _nvidia_smi_reporting(tmp_path: Path, mib: int, apps: str) -> str:
    """A PATH whose nvidia-smi answers the two queries of bench/grpo_bench.py as a card holding ``mib`` would (this
    machine has no GPU)."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(
        f'#!/bin/sh\ncase "$1" in --query-gpu=*) echo {mib} ;; --query-compute-apps=*) printf "{apps}" ;; esac\n'
    )
    tool.chmod(0o755)
    return f"{tool.parent}:/usr/bin:/bin"


def test_a_side_is_not_run_on_a_card_another_process_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _nvidia_smi_reporting(tmp_path, 33832, "6306, python3, 56893\\n7102, python3, 26233\\n"))
    monkeypatch.setattr(grpo_bench, "IDLE_WAIT_S", 0.0)
    marker = tmp_path / "ran"
    info = grpo_bench.run_side(["touch", str(marker)], tmp_path, "kuberl", {}, 10.0)
    assert not marker.exists() and info["exit_code"] is None and info["nvml"] == {}
    assert info["error"].startswith("kuberl not run: the card holds 33832 MiB")
    assert "6306, python3, 56893; 7102, python3, 26233" in info["error"]
    assert Path(info["stderr_log"]).read_text().startswith("the card holds 33832 MiB")


def test_a_side_runs_once_the_card_is_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _nvidia_smi_reporting(tmp_path, 483, ""))
    marker = tmp_path / "ran"
    info = grpo_bench.run_side(["/usr/bin/touch", str(marker)], tmp_path, "kuberl", {}, 10.0)
    assert marker.exists() and info["exit_code"] == 0 and "error" not in info


STOPPED_BENCHMARK = """
import sys
from pathlib import Path
from bench.grpo_bench import end_if_stopped, run_side, stop_on_sigterm, write_result
stop_on_sigterm()
work = Path(sys.argv[1])
side = run_side([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(300)"], work,
                "kuberl", {}, 200.0)
write_result({"kuberl": side}, str(work / "result.json"))
end_if_stopped(side)
"""


def test_sigterm_stops_the_side_that_runs_records_it_and_ends_the_benchmark(tmp_path: Path) -> None:
    """The device script's outer ``timeout`` sends SIGTERM: the side's process group goes with the benchmark, and
    the side is written with what it recorded instead of being lost with the process."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    bench = subprocess.Popen([sys.executable, "-c", STOPPED_BENCHMARK, str(tmp_path)], cwd=root, env=env)
    side_out = tmp_path / "kuberl.out"
    deadline = time.monotonic() + 60
    while not (side_out.exists() and side_out.read_text().strip()):
        assert time.monotonic() < deadline and bench.poll() is None, "the side never started"
        time.sleep(0.1)
    side_pid = int(side_out.read_text())
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=60) == grpo_bench.STOPPED_EXIT
    side = json.loads((tmp_path / "result.json").read_text())["kuberl"]
    assert side["stopped"] is True and side["exit_code"] is None
    assert re.match(r"kuberl stopped by SIGTERM after \d+ s; tail of stderr", side["error"]), side["error"]
    assert not Path(f"/proc/{side_pid}").exists()


def test_without_nvml_nothing_is_recorded() -> None:
    with DeviceMemory() as memory:
        pass
    assert memory.as_dict() == {"available": False} or memory.as_dict()["device_peak_gib"] > 0


def test_trls_sweep_takes_its_fastest_micro_batch_and_marks_the_one_out_of_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outcomes = {
        32: {"tokens_per_s": 18000.0, "wall_s": 80},
        64: {"tokens_per_s": 19500.0, "wall_s": 75},
        128: {"tokens_per_s": 20226.0, "wall_s": 70},
        256: {"error": "trl exit code 1; tail of stderr:\ntorch.OutOfMemoryError: CUDA out of memory.", "wall_s": 30},
    }
    monkeypatch.setattr(grpo_vs_trl, "run_trl", lambda *a: dict(outcomes[a[-1]]))
    args = argparse.Namespace(out="x.json")
    best, runs = grpo_vs_trl.run_trl_sweep(args, "/m", "/d", tmp_path, True, [32, 64, 128, 256])
    assert best["micro_batch"] == 128 and best["tokens_per_s"] == 20226.0
    assert [r["oom"] for r in runs] == [False, False, False, True]


def test_a_benchmark_split_over_calls_is_merged_into_one_result(tmp_path: Path) -> None:
    earlier_doc = {
        "benchmark": "b",
        "model": "smollm2",
        "device": "NVIDIA H100 80GB HBM3",
        "date": "2026-12-06",
        "kuberl": {"tokens_per_s": 30000.0},
        "trl_sweep": [{"micro_batch": 32, "tokens_per_s": 18000.0}, {"micro_batch": 64, "tokens_per_s": 19000.0}],
    }
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier_doc))
    now: dict[str, Any] = {"benchmark": "b", "model": "smollm2", "device": "NVIDIA H100 80GB HBM3"}
    now["trl_sweep"] = [{"micro_batch": 128, "tokens_per_s": 20226.0}, {"micro_batch": 256, "error": "OOM"}]
    whole = grpo_vs_trl.merged(now, read_earlier(str(path), now))
    assert whole["kuberl"] == {"tokens_per_s": 30000.0} and whole["merged"]["sides"] == ["kuberl"]
    assert [r["micro_batch"] for r in whole["trl_sweep"]] == [32, 64, 128, 256]
    assert whole["trl"]["micro_batch"] == 128
    assert "kuberl" not in now, "the run's own result is left as it ran"


def test_each_finished_side_is_written_with_the_earlier_sides_also_over_the_file_it_merges(tmp_path: Path) -> None:
    """``--out`` naming the ``--merge-with`` file (one name per benchmark on the GPU machine): the earlier sides were
    read before the first write, so each write keeps them, and a run stopped after its first side keeps that one."""
    path = tmp_path / "kuberl_1b.json"
    header = {"benchmark": "b", "model": "shape:llama-1.1b", "device": "NVIDIA H100 80GB HBM3"}
    path.write_text(json.dumps({**header, "kuberl_overlap": {"tokens_per_s": 22261.0}}))
    result: dict[str, Any] = dict(header)
    earlier = read_earlier(str(path), result)
    result["kuberl"] = {"tokens_per_s": 15000.0}
    write_result(grpo_vs_trl.merged(result, earlier), str(path))
    written = json.loads(path.read_text())
    assert written["kuberl"] == {"tokens_per_s": 15000.0} and written["kuberl_overlap"] == {"tokens_per_s": 22261.0}
    result["kuberl_async_k1"] = {"tokens_per_s": 20000.0}
    write_result(grpo_vs_trl.merged(result, earlier), str(path))
    assert set(json.loads(path.read_text())) >= {"kuberl", "kuberl_overlap", "kuberl_async_k1"}
    assert [p.name for p in tmp_path.iterdir()] == ["kuberl_1b.json"], "no partial file left behind"


def test_results_of_another_card_are_not_merged(tmp_path: Path) -> None:
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({"benchmark": "b", "model": "smollm2", "device": "NVIDIA H200", "kuberl": {}}))
    with pytest.raises(SystemExit, match="its device is 'NVIDIA H200'"):
        read_earlier(str(path), {"benchmark": "b", "model": "smollm2", "device": "NVIDIA H100 80GB HBM3"})


@pytest.mark.parametrize(
    ("overlap", "fewest"), [("off", 2), ("on", 4), ("both", 4), ("async", 6), ("async-k2", 6), ("all", 6)]
)
def test_the_fewest_steps_leave_one_measured_step_for_every_row(overlap: str, fewest: int) -> None:
    from bench.grpo_bench import add_job_arguments, check_steps

    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    check_steps(parser, parser.parse_args(["--overlap", overlap, "--steps", str(fewest)]))
    with pytest.raises(SystemExit):
        check_steps(parser, parser.parse_args(["--overlap", overlap, "--steps", str(fewest - 1)]))


def test_a_shape_is_written_once_by_a_child_process_over_a_half_written_folder(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    (tmp_path / ".model-smollm2-shape.partial").mkdir()
    (tmp_path / ".model-smollm2-shape.partial" / "config.json").write_text("{")  # a write killed half-way
    folder = Path(shape_folder("shape:smollm2-shape", tmp_path))
    assert folder == tmp_path / "model-smollm2-shape" and not (tmp_path / ".model-smollm2-shape.partial").exists()
    config = AutoConfig.from_pretrained(folder)
    assert (config.hidden_size, config.num_hidden_layers, config.architectures) == (576, 30, ["LlamaForCausalLM"])
    assert AutoTokenizer.from_pretrained(folder).eos_token_id == config.eos_token_id
    written = (folder / "config.json").stat().st_mtime_ns
    assert shape_folder("shape:smollm2-shape", tmp_path) == str(folder)
    assert (folder / "config.json").stat().st_mtime_ns == written


def test_an_unknown_shape_names_the_known_ones(tmp_path: Path) -> None:
    known = "known: llama-1.1b, qwen2-0.5b, smollm2-shape"
    with pytest.raises(SystemExit, match=re.escape(f"no shape 'llama-70b' in bench/shapes.py; {known}")):
        shape_folder("shape:llama-70b", tmp_path)
