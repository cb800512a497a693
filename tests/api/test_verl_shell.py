"""A verl launch script read as bash runs it: variables, defaults, arithmetic, arrays, quoting, `if`; what kuberl
does not run (command substitution, loops, functions) becomes an Unknown naming the line and the variable to pass."""

from __future__ import annotations

import pytest

from kuberl.api.verl_shell import Launch, ShellError, Unknown, read_script


def launch(text: str, **env: str) -> Launch:
    script = read_script(text, env)
    assert len(script.launches) == 1, script
    return script.launches[0]


def args(text: str, **env: str) -> list[str | Unknown]:
    return [w.value for w in launch(text, **env).args]


def test_assignments_defaults_and_arithmetic_expand_as_bash_does() -> None:
    text = """
    NNODES=${NNODES:-4}
    max_prompt=$((1024 * 2))
    max_response=$(( (max_prompt + 2048) / 3 ))
    python3 -m verl.trainer.main_ppo trainer.nnodes=${NNODES} data.max_prompt_length=$max_prompt \\
        data.max_response_length=${max_response}
    """
    assert args(text) == ["trainer.nnodes=4", "data.max_prompt_length=2048", "data.max_response_length=1365"]
    assert args(text, NNODES="16")[0] == "trainer.nnodes=16"


def test_integer_division_truncates_towards_zero_as_in_bash() -> None:
    assert args("python3 -m m a.b=$(( -7 / 2 )) a.c=$(( 7 % 3 ))") == ["a.b=-3", "a.c=1"]


def test_quotes_are_removed_and_keep_spaces_and_hydra_quoting() -> None:
    text = """name="my run"
    python3 -m m trainer.experiment_name="$name" trainer.logger='["console","wandb"]' x.y=\\$HOME"""
    assert args(text) == ["trainer.experiment_name=my run", 'trainer.logger=["console","wandb"]', "x.y=$HOME"]


def test_an_unquoted_variable_is_split_into_several_overrides() -> None:
    text = """COMMON="data.train_batch_size=8 actor_rollout_ref.rollout.n=4"
    python3 -m verl.trainer.main_ppo $COMMON trainer.nnodes=1"""
    assert args(text) == ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "trainer.nnodes=1"]


def test_arrays_with_comments_expand_one_word_per_item() -> None:
    text = """
    DATA=(
        # where the prompts are
        data.train_files="/d/train.parquet"
        data.max_prompt_length=$((256 * 2))
    )
    DATA+=(data.seed=7)
    python3 -m verl.trainer.main_ppo "${DATA[@]}" trainer.nnodes=1
    """
    assert args(text) == [
        "data.train_files=/d/train.parquet",
        "data.max_prompt_length=512",
        "data.seed=7",
        "trainer.nnodes=1",
    ]


def test_substitution_trimming_and_case_forms() -> None:
    text = """MODEL=/models/Qwen2.5-7B
    CFG="actor.a=1 actor.b=2"
    python3 -m m x.name=${MODEL##*/} x.dir=${MODEL%/*} x.low=${MODEL,,} ${CFG//actor/critic}"""
    assert args(text) == ["x.name=Qwen2.5-7B", "x.dir=/models", "x.low=/models/qwen2.5-7b", "critic.a=1", "critic.b=2"]


def test_a_command_substitution_is_unknown_with_its_line_and_the_variable_to_pass() -> None:
    text = "set -x\nPROJECT_DIR=$(pwd)\nCONFIG=$PROJECT_DIR/config\npython3 -m m --config-path=$CONFIG a.b=1\n"
    value = args(text)[0]
    assert isinstance(value, Unknown)
    assert value.line == 2 and value.variable == "PROJECT_DIR"
    assert "`$(pwd)` is a command substitution" in value.reason
    assert value.fix() == "pass --env PROJECT_DIR=VALUE"


def test_env_supplies_what_the_script_reads_and_what_it_cannot_compute() -> None:
    text = "PROJECT_DIR=$(pwd)\npython3 -m m a.b=$PROJECT_DIR/x a.c=$HOME/data"
    assert args(text, PROJECT_DIR="/src/verl", HOME="/data") == ["a.b=/src/verl/x", "a.c=/data/data"]


def test_the_callers_environment_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/laptop")
    value = args("python3 -m m data.train_files=$HOME/train.parquet")[0]
    assert isinstance(value, Unknown) and value.variable == "HOME"


def test_a_default_that_cannot_be_computed_names_the_variable_with_the_default() -> None:
    text = (
        "RAY_DATA_HOME=${RAY_DATA_HOME:-${HOME}/verl}\nMODEL=${MODEL:-$RAY_DATA_HOME/models/q}\npython3 -m m a.b=$MODEL"
    )
    value = args(text)[0]
    assert isinstance(value, Unknown) and value.variable == "MODEL"
    assert args(text, MODEL="/m")[0] == "a.b=/m"


def test_exported_variables_and_a_prefix_reach_the_launch_environment() -> None:
    text = "export WANDB_API_KEY=abc\nexport VLLM_USE_V1=1\nHYDRA_FULL_ERROR=1 python3 -m m a.b=1"
    assert launch(text).environment == {"WANDB_API_KEY": "abc", "VLLM_USE_V1": "1", "HYDRA_FULL_ERROR": "1"}


def test_a_decidable_if_takes_its_branch() -> None:
    text = """backend=fsdp
    if [ "$backend" = "megatron" ]; then
        ENGINE="actor_rollout_ref.actor.strategy=megatron"
    elif [[ $backend == fsdp ]]; then
        ENGINE="actor_rollout_ref.actor.strategy=fsdp"
    else
        exit 1
    fi
    python3 -m verl.trainer.main_ppo $ENGINE"""
    assert args(text) == ["actor_rollout_ref.actor.strategy=fsdp"]
    assert args(text.replace("backend=fsdp", "backend=${BACKEND:-fsdp}"), BACKEND="megatron") == [
        "actor_rollout_ref.actor.strategy=megatron"
    ]


def test_a_value_set_in_an_undecidable_if_is_unknown_unless_env_gives_it() -> None:
    text = """if [ -d /data ]; then TP=2; else TP=1; fi
    python3 -m m actor_rollout_ref.rollout.tensor_model_parallel_size=$TP"""
    value = args(text)[0]
    assert isinstance(value, Unknown) and "inside the if at line 1" in value.reason and value.variable == "TP"
    assert args(text, TP="4") == ["actor_rollout_ref.rollout.tensor_model_parallel_size=4"]


def test_a_usage_check_exits_without_arguments_and_takes_them_from_env() -> None:
    text = """if [ "$#" -lt 2 ]; then
        echo "usage: run.sh NGPUS DIR"; exit 1
    fi
    NGPUS=$1
    shift 2
    python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$NGPUS "$@"
    """
    script = read_script(text, {})
    assert script.launches == [] and "the script exits at line 2" in script.notes[0]
    assert args(text, **{"1": "4", "2": "/ckpt"}) == ["trainer.n_gpus_per_node=4"]


def test_commands_in_loops_and_functions_are_not_run_and_say_so() -> None:
    text = """for seed in 1 2; do
        python3 -m verl.trainer.main_ppo data.seed=$seed
    done
    now() { date +%H; }
    NAME=run_$(now)
    """
    (looped,) = read_script(text).launches
    assert looped.conditional is not None and "for loop at line 1" in looped.conditional


def test_or_branches_are_not_taken_and_and_branches_are() -> None:
    text = "cd /work || exit 1\nmkdir -p x && A=5\npython3 -m m a.b=$A"
    assert args(text) == ["a.b=5"]


def test_ray_job_submit_torchrun_and_wrappers_find_the_entry() -> None:
    submit = launch("ray job submit --no-wait --working-dir . -- python3 -m recipe.dapo.main_dapo a.b=1")
    assert submit.entry == "recipe.dapo.main_dapo"
    assert launch("nohup env A=1 torchrun --nproc_per_node=8 -m verl.trainer.main_ppo a.b=1 > log 2>&1 &").entry == (
        "verl.trainer.main_ppo"
    )
    assert launch("srun --overlap -w head python -m verl.trainer.main_ppo a.b=1 | tee out.log").entry == (
        "verl.trainer.main_ppo"
    )


def test_commands_without_overrides_are_not_launches() -> None:
    text = "python3 examples/data_preprocess/gsm8k.py --local_dir ~/data\npython3 -c 'import ray'\n"
    assert read_script(text).launches == []


def test_a_heredoc_is_skipped() -> None:
    text = "cat > x.py << EOF\nA=$(oops\nEOF\npython3 -m m a.b=2"
    assert args(text) == ["a.b=2"]


def test_an_unclosed_quote_names_the_line() -> None:
    with pytest.raises(ShellError, match="line 2"):
        read_script("A=1\nB='open\n")
