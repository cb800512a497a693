import asyncio
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from kuberl.trainer.model import loading
from kuberl.trainer.rewards.functions import (
    BUILTINS,
    ERROR_KEY,
    MAX_ABS_SCORE,
    SCORE_DTYPE,
    NonFiniteRewardError,
    RewardFunctionError,
    RewardFunctionLoadError,
    RewardInput,
    RewardOutput,
    default,
    exact_match,
    gsm8k,
    load_reward_function,
    prefix_match,
)
from kuberl.trainer.rewards.model import RewardModelScorer
from kuberl.trainer.rewards.scoring import check_finite, score_batch

os.environ["HF_HUB_OFFLINE"] = "1"


def sample(solution: str = "#### 3", ground_truth: str = "3", data_source: str = "openai/gsm8k") -> RewardInput:
    return RewardInput(data_source=data_source, solution_str=solution, ground_truth=ground_truth, extra_info={})


# builtins


def test_gsm8k_scores_one_when_the_last_marked_number_matches() -> None:
    assert gsm8k("openai/gsm8k", "2+1=3 so\n#### 3", "3") == 1.0


def test_gsm8k_uses_the_last_marked_number() -> None:
    assert gsm8k("openai/gsm8k", "#### 3 no wait #### 4", "3") == 0.0


def test_gsm8k_removes_thousands_separators() -> None:
    assert gsm8k("openai/gsm8k", "#### 1,234", "1234") == 1.0


def test_gsm8k_scores_zero_without_a_marked_answer() -> None:
    assert gsm8k("openai/gsm8k", "the answer is 3", "3") == 0.0


def test_gsm8k_compares_text_so_a_trailing_period_does_not_match() -> None:
    assert gsm8k("openai/gsm8k", "#### 3.", "3") == 0.0


def test_gsm8k_searches_only_the_last_300_characters() -> None:
    assert gsm8k("openai/gsm8k", "#### 3" + " " * 300, "3") == 0.0


def test_exact_match_ignores_surrounding_whitespace_only() -> None:
    assert exact_match("x", "  Paris\n", "Paris") == 1.0
    assert exact_match("x", "Paris.", "Paris") == 0.0


def test_prefix_match_ignores_what_follows_the_answer() -> None:
    assert prefix_match("kuberl/digits", " 7xq<", "7") == 1.0
    assert prefix_match("kuberl/digits", "x7", "7") == 0.0


def test_default_dispatches_by_data_source() -> None:
    assert default("openai/gsm8k", "#### 12", "12") == 1.0
    assert default("kuberl/digits", "5 and more", "5") == 1.0


def test_default_names_an_unknown_data_source_and_the_builtins() -> None:
    with pytest.raises(RewardFunctionError, match=r"'lighteval/MATH'.*openai/gsm8k.*exact_match"):
        default("lighteval/MATH", "x", "y")


# loading


def test_load_reward_function_returns_builtins_by_name() -> None:
    assert {"gsm8k", "exact_match", "prefix_match", "default"} <= set(BUILTINS)
    assert load_reward_function("gsm8k") is gsm8k


def test_load_reward_function_imports_module_colon_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rewards.py").write_text("def compute_score(ds, sol, gt, extra):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward_function("my_rewards:compute_score")
    assert fn("d", "s", "g", {}) == 0.5
    sys.modules.pop("my_rewards")


def test_load_reward_function_loads_a_file_path(tmp_path: Path) -> None:
    (tmp_path / "score.py").write_text("def length(ds, sol, gt, extra):\n    return len(sol)\n")
    assert load_reward_function(f"{tmp_path}/score.py:length")("d", "abc", "g", {}) == 3


def test_load_reward_function_names_a_missing_module() -> None:
    with pytest.raises(RewardFunctionLoadError, match=r"cannot import 'no_such_module_xyz'.*PYTHONPATH"):
        load_reward_function("no_such_module_xyz:fn")


def test_load_reward_function_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RewardFunctionLoadError, match="does not exist"):
        load_reward_function(f"{tmp_path}/absent.py:fn")


def test_load_reward_function_names_a_missing_attribute_and_the_callables_there(tmp_path: Path) -> None:
    (tmp_path / "score.py").write_text("def compute_score(ds, sol, gt, extra):\n    return 1\n")
    with pytest.raises(RewardFunctionLoadError, match=r"no attribute 'score'.*compute_score"):
        load_reward_function(f"{tmp_path}/score.py:score")


def test_load_reward_function_refuses_a_non_callable(tmp_path: Path) -> None:
    (tmp_path / "score.py").write_text("THRESHOLD = 3\n")
    with pytest.raises(RewardFunctionLoadError, match="THRESHOLD is a int, not callable"):
        load_reward_function(f"{tmp_path}/score.py:THRESHOLD")


def test_load_reward_function_refuses_an_unknown_bare_name() -> None:
    with pytest.raises(RewardFunctionLoadError, match=r"neither a builtin.*'module:function'"):
        load_reward_function("gsm9k")


# scoring


def test_score_batch_turns_numbers_and_bools_into_float_scores() -> None:
    values = iter([1, True, 0.25])
    outputs = score_batch(lambda ds, sol, gt, extra: next(values), [sample()] * 3)
    assert outputs == [RewardOutput(1.0), RewardOutput(1.0), RewardOutput(0.25)]


def test_score_batch_keeps_numeric_dict_keys_as_extras_and_leaves_out_the_rest() -> None:
    def fn(ds: str, sol: str, gt: str, extra: dict) -> dict:
        return {"score": 0.5, "acc": True, "length": 12, "pred": "42"}

    assert score_batch(fn, [sample()]) == [RewardOutput(0.5, {"acc": 1.0, "length": 12.0})]


def test_score_batch_passes_verl_arguments_in_order() -> None:
    seen = []
    score_batch(lambda *args: seen.append(args) or 0.0, [RewardInput("src", "sol", "gt", {"split": "train"})])
    assert seen == [("src", "sol", "gt", {"split": "train"})]


def test_a_raising_function_names_itself_the_sample_and_chains_the_cause() -> None:
    def picky(ds: str, sol: str, gt: str, extra: dict) -> float:
        if sol.startswith("x"):
            raise KeyError("answer")
        return 1.0

    with pytest.raises(RewardFunctionError) as error:
        score_batch(picky, [sample(), sample("x" * 500, "41", "my/source")])
    message = str(error.value)
    assert "picky" in message and "sample 1" in message and "'my/source'" in message and "'41'" in message
    assert "x" * 200 in message and "x" * 201 not in message
    assert isinstance(error.value.__cause__, KeyError)


def test_a_non_numeric_return_is_an_error_naming_the_value() -> None:
    with pytest.raises(RewardFunctionError, match=r"returned 'good' \(str\)"):
        score_batch(lambda *args: "good", [sample()])


def test_a_nan_score_is_an_error() -> None:
    with pytest.raises(RewardFunctionError, match="returned nan"):
        score_batch(lambda *args: float("nan"), [sample()])


def test_a_score_finite_in_float64_but_not_in_float32_is_an_error_naming_the_sample() -> None:
    with pytest.raises(NonFiniteRewardError, match=r"returned 1e\+39, which is inf in torch.float32 on sample 1") as e:
        score_batch(lambda ds, sol, gt, extra: 1e39 if sol == "big" else 1.0, [sample(), sample("big", "7", "my/src")])
    assert "data_source='my/src'" in str(e.value) and "ground_truth='7'" in str(e.value)


@pytest.mark.parametrize("score", [-1e39, 10**400, {"score": float("inf")}], ids=["-1e39", "10**400", "dict-inf"])
def test_scores_beyond_float32_are_errors_whatever_their_type(score: object) -> None:
    with pytest.raises(NonFiniteRewardError, match=r"in torch\.float32"):
        score_batch(lambda *args: score, [sample()])


def test_scores_up_to_the_largest_accepted_magnitude_pass_and_beyond_it_fail() -> None:
    assert score_batch(lambda *args: -MAX_ABS_SCORE, [sample()])[0].score == -MAX_ABS_SCORE
    with pytest.raises(NonFiniteRewardError, match=r"returned -3\.4e\+38, .*; return a finite score within ±1e\+06"):
        score_batch(lambda *args: -3.4e38, [sample()])  # finite in float32, yet a group of them has no variance


def test_on_error_zero_scores_raising_samples_zero_and_marks_them_within_the_fraction() -> None:
    def fn(ds: str, sol: str, gt: str, extra: dict) -> float:
        if sol == "bad":
            raise ValueError("unparseable")
        return 1.0

    batch = [sample("ok"), sample("bad"), sample("ok"), sample("ok")]
    outputs = score_batch(fn, batch, on_error="zero", max_error_fraction=0.25)
    assert [o.score for o in outputs] == [1.0, 0.0, 1.0, 1.0]
    assert [o.extra[ERROR_KEY] for o in outputs] == [0.0, 1.0, 0.0, 0.0]


def test_on_error_zero_fails_when_more_than_the_fraction_raise() -> None:
    def fn(ds: str, sol: str, gt: str, extra: dict) -> float:
        if sol == "bad":
            raise ValueError("unparseable")
        return 1.0

    batch = [sample("ok"), sample("bad"), sample("bad"), sample("ok")]
    with pytest.raises(RewardFunctionError, match=r"sample 1.*2 of 4 samples raised \(reward.onError zero allows 0.25"):
        score_batch(fn, batch, on_error="zero", max_error_fraction=0.25)


def test_on_error_zero_still_fails_on_a_non_finite_score() -> None:
    with pytest.raises(NonFiniteRewardError):
        score_batch(lambda *args: float("nan"), [sample()], on_error="zero", max_error_fraction=1.0)


def test_a_dict_without_score_is_an_error_naming_its_keys() -> None:
    with pytest.raises(RewardFunctionError, match=r"without 'score' \(\['acc'\]\)"):
        score_batch(lambda *args: {"acc": 1.0}, [sample()])


def test_async_functions_run_concurrently() -> None:
    started = 0
    all_started = asyncio.Event()

    async def fn(ds: str, sol: str, gt: str, extra: dict) -> float:
        nonlocal started
        started += 1
        if started == 3:
            all_started.set()
        await asyncio.wait_for(all_started.wait(), timeout=5)  # sequential calls would time out here
        return float(sol == gt)

    assert [o.score for o in score_batch(fn, [sample("1", "1"), sample("2", "1"), sample("1", "1")])] == [1, 0, 1]


def test_an_async_function_raising_is_reported_with_its_sample() -> None:
    async def fn(ds: str, sol: str, gt: str, extra: dict) -> float:
        if sol == "bad":
            raise ValueError("boom")
        return 1.0

    with pytest.raises(RewardFunctionError, match=r"raised ValueError: boom on sample 1") as error:
        score_batch(fn, [sample("ok"), sample("bad")])
    assert isinstance(error.value.__cause__, ValueError)


def test_async_functions_work_when_called_from_inside_an_event_loop() -> None:
    async def fn(ds: str, sol: str, gt: str, extra: dict) -> float:
        return 2.0

    async def caller() -> list[RewardOutput]:
        return score_batch(fn, [sample()])

    assert asyncio.run(caller()) == [RewardOutput(2.0)]


# reward model


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rm")
    config = loading.tiny_config(loading.parse_tiny("tiny://llama?seed=3"), num_labels=1)
    torch.manual_seed(3)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    loading.tiny_tokenizer().save_pretrained(folder)
    return folder


TEXTS = ["short", "a somewhat longer text", "#### 42", "x", "the last one, longest of all the texts here"]


def test_reward_model_scores_do_not_depend_on_batching_or_padding(reward_model_dir: Path) -> None:
    batched = RewardModelScorer(str(reward_model_dir), micro_batch_size=2, dtype=torch.float32, max_length=64)
    single = RewardModelScorer(str(reward_model_dir), micro_batch_size=1, dtype=torch.float32, max_length=64)
    assert batched.score(TEXTS) == pytest.approx(single.score(TEXTS), abs=1e-5)


def test_reward_model_score_is_the_classifier_output_at_the_last_token(reward_model_dir: Path) -> None:
    scorer = RewardModelScorer(str(reward_model_dir), micro_batch_size=4, dtype=torch.float32, max_length=64)
    ids = scorer.tokenizer(TEXTS[1], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = scorer.model(ids).logits[0, 0].item()
    assert scorer.score([TEXTS[1]]) == [pytest.approx(expected, abs=1e-5)]


def test_reward_model_truncates_on_the_right(reward_model_dir: Path) -> None:
    scorer = RewardModelScorer(str(reward_model_dir), micro_batch_size=2, dtype=torch.float32, max_length=8)
    first, second = scorer.score(["12345678 and more", "12345678 but different"])
    assert first == pytest.approx(second, abs=1e-6)


def test_reward_model_runs_micro_batches_of_its_size(reward_model_dir: Path) -> None:
    scorer = RewardModelScorer(str(reward_model_dir), micro_batch_size=2, dtype=torch.float32, max_length=64)
    sizes = []
    scorer.model.model.register_forward_hook(
        lambda module, args, kwargs, out: sizes.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    scorer.score(TEXTS)
    assert sizes == [2, 2, 1]


def test_a_reward_model_with_several_labels_is_refused(tmp_path: Path) -> None:
    config = loading.tiny_config(loading.parse_tiny("tiny://llama"), num_labels=2)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    loading.tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_labels=2"):
        RewardModelScorer(str(tmp_path), micro_batch_size=1, dtype=torch.float32, max_length=8)


def test_generated_gsm8k_rows_are_scored_by_the_gsm8k_rule_under_their_own_source() -> None:
    from kuberl.trainer.data.tasks import GSM8K_SYNTH_SOURCE, gsm8k_synth

    row = gsm8k_synth(1, seed=0, split="test")[0]
    truth = row["reward_model"]["ground_truth"]
    assert row["data_source"] == GSM8K_SYNTH_SOURCE != "openai/gsm8k"
    assert default(row["data_source"], f"so\n#### {truth}", truth) == 1.0
    assert default(row["data_source"], f"#### {int(truth) + 1}", truth) == 0.0


def test_a_reward_model_with_a_diverged_head_fails_the_finiteness_check_naming_sample_and_model(
    reward_model_dir: Path,
) -> None:
    scorer = RewardModelScorer(str(reward_model_dir), micro_batch_size=2, dtype=torch.float32, max_length=64)
    with torch.no_grad():
        scorer.model.get_submodule("score").weight[0, 0] = float("nan")
    scores = torch.tensor(scorer.score(TEXTS[:3]), dtype=SCORE_DTYPE)
    with pytest.raises(
        NonFiniteRewardError, match=r"reward.model /rm scored nan on sample 0 \(data_source='a'\); 3 of 3"
    ):
        check_finite(scores, ["a", "b", "c"], "reward.model /rm")


def test_finite_reward_model_scores_pass_the_check(reward_model_dir: Path) -> None:
    scorer = RewardModelScorer(str(reward_model_dir), micro_batch_size=2, dtype=torch.float32, max_length=64)
    check_finite(torch.tensor(scorer.score(TEXTS[:2]), dtype=SCORE_DTYPE), ["a", "b"], "reward.model /rm")
