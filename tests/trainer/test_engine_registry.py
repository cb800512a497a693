"""A rollout engine is one module plus one registry entry: this test module is the module (:class:`FixedAnswer`, a
deterministic engine that still returns real token tensors of the policy's tokenizer) and registers it alone; the
run goes through ``kuberl run`` on CPU, and admission reads what the entry declares."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch
import yaml
from torch import Tensor

from kuberl.api import InvalidSpec, parse_spec
from kuberl.api.engines import ENGINES, Transport
from kuberl.trainer.model.loading import load_tokenizer
from kuberl.trainer.observe.metrics import read_jsonl
from kuberl.trainer.plan.execution import EngineArgs
from kuberl.trainer.rollout.base import ColocatedRollout, RolloutBatch, left_pad, response_mask_from_eos
from kuberl.trainer.rollout.registry import REGISTRY, Engine, EngineContext, SeparateEngine, register_engine
from tests.api.test_engine_rules import PLAIN
from tests.trainer.kuberl_cli import REPO

ANSWER = "7"


class FixedAnswer(ColocatedRollout):
    """Answers every prompt with :data:`ANSWER` and eos, whatever its weights; it takes them like any colocated
    engine."""

    def __init__(self, model_path: str, *, pad_id: int, eos_ids: list[int]) -> None:
        self.answer = [*load_tokenizer(model_path)(ANSWER, add_special_tokens=False)["input_ids"], eos_ids[0]]
        self.pad_id, self.eos_ids = pad_id, eos_ids
        self.updates = 0

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        temperature: float,
        top_p: float,
        top_k: int,
        max_new_tokens: int,
        stop: tuple[str, ...] = (),
    ) -> RolloutBatch:
        expanded = [p for p in prompts for _ in range(n)]
        ids, mask = left_pad(expanded, self.pad_id)
        responses = torch.tensor([self.answer[:max_new_tokens]] * len(expanded))
        response_mask = response_mask_from_eos(responses, self.eos_ids)
        return RolloutBatch(ids, mask, responses.masked_fill(response_mask == 0, self.pad_id), response_mask)

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        for _ in named_tensors:  # the ranks gather the full weights together: take them all
            pass
        self.updates += 1


def fixed_answer(args: EngineArgs, context: EngineContext) -> ColocatedRollout:
    return FixedAnswer(args.model_path, pad_id=context.pad_id, eos_ids=context.eos_ids)


CAPABILITIES = PLAIN
"""A CPU engine, colocated only, without log-probs (as tests/api/test_engine_rules.py declares one)."""
ENTRY = Engine("fixed-answer", "fixed answer", CAPABILITIES, colocated=fixed_answer, separate=None)


@pytest.fixture
def registered() -> Iterator[Engine]:
    register_engine(ENTRY)
    yield ENTRY
    del REGISTRY[ENTRY.name], ENGINES[ENTRY.name]


def tiny_job(tmp_path: Path, **rollout: object) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    spec = doc["spec"]
    spec["data"].update(trainFiles=[str(REPO / f) for f in spec["data"]["trainFiles"]], valFiles=[])
    spec["batch"].update(trainBatchSize=4, rolloutN=2, ppoMiniBatchSize=4, ppoMicroBatchSizePerGPU=8)
    spec["rollout"].update(rollout)
    spec["reward"] = {"function": f"{tmp_path / 'reward.py'}:answered"}
    spec["trainer"].update(
        totalSteps=2, testFreq=-1, saveFreq=-1, checkpointDir=str(tmp_path / "ckpt"), metricsPort=0, loggers=["jsonl"]
    )
    spec["trainer"]["valBeforeTrain"] = False
    (tmp_path / "reward.py").write_text(
        f"def answered(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    return float(solution_str == {ANSWER!r})\n"
    )
    return doc


@pytest.mark.timeout(400)
def test_an_engine_registered_by_this_module_trains_through_kuberl_run(
    registered: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kuberl.cli import main

    monkeypatch.chdir(REPO)  # Ray's workers import this module (the entry's factory) from the driver's directory
    spec_file = tmp_path / "fixed.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_job(tmp_path, engine=registered.name)))
    assert main(["run", str(spec_file), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "critic/score/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # every response scored was the engine's: the reward is 1 exactly for the answer it always gives
    assert all(r["critic/score/mean"] == 1.0 for r in steps)
    # and the actor ranks synced their weights into it after step 1 (the batch of step 2 carries version 1)
    assert [r["rollout/weight_version"] for r in steps] == [0, 1]


def test_admission_reads_what_the_entry_declares(registered: Engine, tmp_path: Path) -> None:
    spec = tiny_job(tmp_path, engine=registered.name)["spec"]
    assert parse_spec(spec).rollout.engine == registered.name
    with pytest.raises(InvalidSpec) as refused:
        parse_spec({**spec, "rollout": {**spec["rollout"], "calculateLogProbs": True}})
    assert [i.rule for i in refused.value.issues] == ["engine-log-probs"]
    separate = {**spec, "rollout": {**spec["rollout"], "placement": "separate"}}
    separate["cluster"] = {**spec["cluster"], "rollout": {"nodes": 1, "gpusPerNode": 1}}
    with pytest.raises(InvalidSpec, match=r"cannot run separate on cluster\.device cpu; engines that can: hf"):
        parse_spec(separate)


def test_without_the_entry_the_engine_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="unknown rollout engine 'fixed-answer'; known: vllm, hf"):
        parse_spec(tiny_job(tmp_path, engine="fixed-answer")["spec"])


def test_an_entry_must_have_the_factories_its_capabilities_declare() -> None:
    def separate(args: EngineArgs, context: EngineContext, transport: Transport) -> SeparateEngine:
        raise AssertionError("never made")

    with pytest.raises(ValueError, match=r"a separate factory exactly when capabilities\.separate_devices"):
        register_engine(Engine("half", "half", CAPABILITIES, colocated=fixed_answer, separate=separate))
    with pytest.raises(ValueError, match="'hf' is registered already"):
        register_engine(Engine("hf", "hf", ENGINES["hf"], colocated=fixed_answer, separate=separate))
    assert "half" not in ENGINES
