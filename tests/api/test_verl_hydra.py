"""verl's configs composed as Hydra composes them (defaults lists, groups, `@package`, `${group}` choices, `override`,
`_self_`, interpolations), on a small config tree laid out like verl's `trainer/config`; and the import of a run
that names its config (`--config-name`) against such a tree, or without one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kuberl.api.verl import VerlInputError
from kuberl.api.verl_hydra import Override, compose
from kuberl.api.verl_import import read_run
from kuberl.cli import main

TREE = {
    "ppo_trainer.yaml": """
defaults:
  - model_engine: dp
  - actor@actor_rollout_ref.actor: ${model_engine}_actor
  - rollout@actor_rollout_ref.rollout: rollout
  - _self_
data:
  train_batch_size: 1024
  max_prompt_length: 512
actor_rollout_ref:
  model:
    path: ~/models/base
  ref:
    log_prob_micro_batch_size_per_gpu: ${oc.select:actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu,null}
    strategy: ${actor_rollout_ref.actor.strategy}
algorithm:
  adv_estimator: gae
trainer:
  nnodes: 1
  n_gpus_per_node: 8
  logger: [console, wandb]
  experiment_name: gsm8k
""",
    "model_engine/dp.yaml": "# @package _global_\nmodel_engine: dp\n",
    "model_engine/megatron.yaml": "# @package _global_\nmodel_engine: megatron\n",
    "actor/actor.yaml": "ppo_mini_batch_size: 256\nppo_micro_batch_size_per_gpu: null\nclip_ratio: 0.2\n",
    "actor/dp_actor.yaml": "defaults:\n  - ../optim@optim: fsdp\n  - actor\n  - _self_\nstrategy: fsdp\n",
    "actor/megatron_actor.yaml": "defaults:\n  - actor\n  - _self_\nstrategy: megatron\n",
    "optim/fsdp.yaml": "lr: 1.0e-6\nlr_warmup_steps: -1\n",
    "rollout/rollout.yaml": "name: ???\nn: 1\ntensor_model_parallel_size: 2\ncheckpoint:\n  load: ${.save}\n  save: model\n",
    "ppo_megatron_trainer.yaml": "defaults:\n  - ppo_trainer\n  - override model_engine: megatron\n  - _self_\n",
}


@pytest.fixture
def verl_config(tmp_path: Path) -> Path:
    root = tmp_path / "verl" / "trainer" / "config"
    for name, text in TREE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text.lstrip())
    return root


def test_groups_land_at_their_package_with_self_last(verl_config: Path) -> None:
    composed = compose(verl_config / "ppo_trainer.yaml", [verl_config], [])
    actor = composed.config["actor_rollout_ref"]["actor"]
    assert actor == {
        "optim": {"lr": 1e-6, "lr_warmup_steps": -1},
        "ppo_mini_batch_size": 256,
        "ppo_micro_batch_size_per_gpu": None,
        "clip_ratio": 0.2,
        "strategy": "fsdp",
    }
    assert composed.config["model_engine"] == "dp"  # `# @package _global_`


def test_interpolations_resolve_absolute_relative_and_oc_select(verl_config: Path) -> None:
    composed = compose(
        verl_config / "ppo_trainer.yaml",
        [verl_config],
        [Override("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 4)],
    )
    assert composed.get("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu") == 4
    assert composed.get("actor_rollout_ref.ref.strategy") == "fsdp"
    assert composed.get("actor_rollout_ref.rollout.checkpoint.load") == "model"
    assert composed.get("actor_rollout_ref.rollout.name") is None  # ??? is unset


def test_override_in_a_defaults_list_and_on_the_command_line_pick_the_group_option(verl_config: Path) -> None:
    megatron = compose(verl_config / "ppo_megatron_trainer.yaml", [verl_config], [])
    assert megatron.get("actor_rollout_ref.actor.strategy") == "megatron"
    chosen = compose(verl_config / "ppo_trainer.yaml", [verl_config], [Override("model_engine", "megatron")])
    assert chosen.get("actor_rollout_ref.actor.strategy") == "megatron"


def test_a_run_takes_verls_defaults_and_lists_only_what_it_sets(verl_config: Path, tmp_path: Path) -> None:
    run = read_run(
        ["data.train_files=/d.parquet", "actor_rollout_ref.model.path=/m", "actor_rollout_ref.rollout.n=4"],
        verl_config=verl_config,
    )
    assert run.values["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2  # verl's default
    assert run.explicit == {"data.train_files", "actor_rollout_ref.model.path", "actor_rollout_ref.rollout.n"}


def test_a_verl_default_that_differs_from_kuberls_is_imported_with_a_note(
    verl_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "import-verl",
        "data.train_files=/d.parquet",
        "actor_rollout_ref.model.path=/m",
        "--verl-config",
        str(verl_config),
    ]
    main(args)
    captured = capsys.readouterr()
    spec = yaml.safe_load(captured.out)["spec"]
    assert spec["rollout"]["tensorParallelSize"] == 2 and spec["trainer"]["loggers"] == ["console", "wandb"]
    assert "tensor_model_parallel_size=2 is verl's default: rollout.tensorParallelSize = 2" in captured.err
    assert "warmupSteps" not in spec.get("actor", {}).get("optim", {})  # verl's -1 is kuberl's 0, the default
    assert "critic" in spec  # gae, verl's default estimator, trains a critic


def test_a_script_names_its_config_next_to_it(verl_config: Path, tmp_path: Path) -> None:
    config = tmp_path / "recipe" / "config"
    config.mkdir(parents=True)
    (config / "my_grpo.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "algorithm:\n  adv_estimator: grpo\nactor_rollout_ref:\n  rollout:\n    n: 8\n"
    )
    script = tmp_path / "recipe" / "run.sh"
    script.write_text(
        'HERE=$(pwd)\npython3 -m verl.trainer.main_ppo --config-path=config --config-name=my_grpo "$@" data.seed=3\n'
    )
    run = read_run([str(script)], verl_config=verl_config)
    assert run.values["algorithm.adv_estimator"] == "grpo" and run.values["actor_rollout_ref.rollout.n"] == 8
    assert run.values["data.seed"] == 3
    assert {"algorithm.adv_estimator", "actor_rollout_ref.rollout.n", "data.seed"} <= (run.explicit or set())


def test_a_named_config_without_verls_files_is_refused_with_what_is_needed(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo --config-name=gsm8k_multiturn_grpo data.seed=3\n")
    with pytest.raises(VerlInputError, match=r"run.sh:1 --config-name names gsm8k_multiturn_grpo.yaml.*pip install"):
        read_run([str(script)], installed_verl=False)


def test_a_yaml_with_defaults_without_verls_files_is_refused_with_what_is_needed(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("defaults:\n  - ppo_trainer\n  - _self_\nactor_rollout_ref:\n  rollout:\n    n: 8\n")
    with pytest.raises(VerlInputError, match=r"its defaults need ppo_trainer.yaml.*--verl-config DIR"):
        read_run([str(path)], installed_verl=False)


def test_a_config_groups_option_is_not_a_run(verl_config: Path) -> None:
    with pytest.raises(VerlInputError, match="is not an RL run's config"):
        read_run([str(verl_config / "actor" / "dp_actor.yaml")], verl_config=verl_config)
