"""The import corpus: every configuration file of verl's published wheel (PyPI verl==0.9.1, sha256-pinned, fetched
once into ~/.cache/kuberl by tests/api/verl_dist.py). Each is refused with its reason, or imports to an RLJob that
is valid or names what it needs; each trainer config, given the keys verl itself requires of a run, imports to a
valid RLJob whose mapped fields are checked. None is degraded silently. docs/migrating-from-verl.md has the counts.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from e2e.fixtures import missing_tool
from kuberl.api.verl import GLOBAL_MICRO_BATCH_KEYS, lookup, rljob_default, value_at
from kuberl.api.verl_hydra import compose
from kuberl.api.verl_import import read_run
from kuberl.cli import main
from tests.api.verl_dist import VERL_VERSION, Unavailable, verl_distribution

TRAINER_CONFIG = "trainer/config"
GROUP_OPTION = ("refused", "is not an RL run's config")
NOT_FSDP = "the trainer is FSDP2 only"
BYPASS = "algorithm.rollout_correction.bypass_mode=True: old log-probs are always recomputed"
MICRO_BATCH = ("invalid", "[micro-batch-required]")  # verl's defaults leave it unset; verl refuses such a run too

EXPECTED: dict[str, tuple[str, str]] = {
    "trainer/config/ppo_trainer.yaml": MICRO_BATCH,
    "trainer/config/_generated_ppo_trainer.yaml": MICRO_BATCH,
    "trainer/config/ppo_megatron_trainer.yaml": ("refused", f"model_engine=megatron: {NOT_FSDP}"),
    "trainer/config/_generated_ppo_megatron_trainer.yaml": ("refused", f"strategy=megatron: {NOT_FSDP}"),
    "trainer/config/_generated_ppo_torchtitan_trainer.yaml": ("refused", f"strategy=torchtitan: {NOT_FSDP}"),
    "trainer/config/_generated_ppo_veomni_trainer.yaml": ("refused", f"strategy=veomni: {NOT_FSDP}"),
    "experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml": ("refused", BYPASS),
    "experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml": ("refused", BYPASS),
    "experimental/fully_async_policy/config/fully_async_ppo_megatron_trainer.yaml": (
        "refused",
        "model_engine=megatron",
    ),
    "experimental/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml": (
        "refused",
        "model_engine=megatron",
    ),
    # SFT, evaluation and the options of the trainer configs' groups: not RL runs
    "trainer/config/sft_trainer_engine.yaml": GROUP_OPTION,
    "trainer/config/evaluation.yaml": GROUP_OPTION,
    "trainer/config/legacy_reward_impl.yaml": GROUP_OPTION,
    **{
        f"trainer/config/{group}/{option}.yaml": GROUP_OPTION
        for group, options in {
            "actor": ["actor", "dp_actor", "megatron_actor", "torchtitan_actor", "veomni_actor"],
            "critic": ["critic", "dp_critic", "megatron_critic", "torchtitan_critic", "veomni_critic"],
            "ref": ["ref", "dp_ref", "megatron_ref", "torchtitan_ref", "veomni_ref"],
            "engine": ["automodel", "fsdp", "megatron", "torchtitan", "veomni"],
            "optim": ["automodel", "fsdp", "megatron", "torchtitan", "veomni"],
            "model_engine": ["dp", "megatron", "torchtitan", "veomni"],
            "algorithm": ["rollout_correction"],
            "data": ["legacy_data"],
            "distillation": ["distillation"],
            "model": ["hf_model"],
            "npu_profile": ["npu_profile"],
            "profiler": ["profiler"],
            "reward": ["reward"],
            "rollout": ["rollout"],
            "transfer_queue": ["transfer_queue"],
        }.items()
        for option in options
    },
}
RUN_NEEDS = [  # what verl itself requires of a run beyond its defaults (its ??? and null micro-batch)
    "data.train_files=/data/train.parquet",
    "actor_rollout_ref.model.path=/models/policy",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.name=vllm",
]
TRAINER_CONFIGS = [path for path, (outcome, _) in EXPECTED.items() if outcome != "refused" or GROUP_OPTION[1] not in _]


@pytest.fixture(scope="module")
def verl() -> Path:
    try:
        return verl_distribution() / "verl"
    except Unavailable as exc:
        missing_tool(f"verl {VERL_VERSION} from PyPI: {exc}")
        raise


def run_import(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["import-verl", *args])
    return code, out.getvalue(), err.getvalue()


def test_the_corpus_is_every_yaml_of_the_wheel(verl: Path) -> None:
    assert sorted(str(p.relative_to(verl)) for p in verl.rglob("*.yaml")) == sorted(EXPECTED)


def test_each_config_imports_or_is_refused_with_its_reason(verl: Path) -> None:
    outcomes = {}
    for relative, (expected, reason) in EXPECTED.items():
        code, out, err = run_import(str(verl / relative), "--verl-config", str(verl / TRAINER_CONFIG))
        outcome = {0: "valid", 1: "invalid", 2: "refused"}[code]
        outcomes[relative] = outcome
        assert (outcome, reason in err) == (expected, True), f"{relative}: exit {code}\n{err[-2000:]}"
        assert (out != "") == (outcome != "refused"), relative
    assert sorted(outcomes.values()).count("refused") == sum(1 for o, _ in EXPECTED.values() if o == "refused")


@pytest.mark.parametrize("relative", TRAINER_CONFIGS)
def test_a_trainer_config_run_imports_with_every_key_mapped_listed_or_dropped(verl: Path, relative: str) -> None:
    lossy = ["--lossy"] if EXPECTED[relative][0] == "refused" else []
    code, out, err = run_import(str(verl / relative), "--verl-config", str(verl / TRAINER_CONFIG), *RUN_NEEDS, *lossy)
    assert code == 0, err[-3000:]
    spec = yaml.safe_load(out)["spec"]
    run = read_run([str(verl / relative), *RUN_NEEDS], verl_config=verl / TRAINER_CONFIG)
    printed = {
        line.split(": ", 1)[1].split("=", 1)[0]
        for line in err.splitlines()
        if line.startswith(("not imported", "dropped"))
    }
    for key in sorted(run.explicit or ()):
        value, entry = run.values[key], lookup(key)
        if entry is None or entry.rljob is None or key in GLOBAL_MICRO_BATCH_KEYS or value is None:
            assert key in printed or value is None or (entry is not None and entry.runs_the_same(value)), key
            continue
        if key in printed:
            continue
        mapped = value_at(spec, entry.rljob)
        if mapped is not None:
            assert mapped == entry.convert(value), f"{key}={value!r} became {entry.rljob}={mapped!r}"
        else:
            assert entry.convert(value) == rljob_default(entry.rljob) or entry.rljob == "metadata.name", key
    assert spec["model"]["path"] == "/models/policy" and spec["batch"]["ppoMicroBatchSizePerGPU"] == 4


@pytest.mark.parametrize("name", ["ppo_trainer", "ppo_megatron_trainer"])
def test_composition_equals_the_config_verl_generates_from_it(verl: Path, name: str) -> None:
    config = verl / TRAINER_CONFIG
    composed = compose(config / f"{name}.yaml", [config], []).config
    composed.pop("model_engine")  # the group choice itself, which verl's generator leaves out
    generated = yaml.safe_load((config / f"_generated_{name}.yaml").read_text())
    assert composed == generated
