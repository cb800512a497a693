"""The supervised warm-up's demonstrations are the agent loop's own trajectories; training lowers their loss and the
saved folder loads by path."""

from pathlib import Path

import pytest
import torch

from kuberl.api.spec import Agent
from kuberl.trainer.data.tasks import arithmetic
from kuberl.trainer.model.loading import TINY_SCHEME, load_causal_lm, tiny_tokenizer
from kuberl.trainer.rollout.agent import AgentLoop, ObservationRenderer, find_call
from kuberl.trainer.rollout.tools import calculator
from kuberl.trainer.warmup import arithmetic_demonstration, main, save_policy, warm_up
from tests.trainer.test_agent_loop import ScriptedPolicy

TOKENIZER = tiny_tokenizer()
RENDERER = ObservationRenderer(TOKENIZER, "chat_template")
ROW = arithmetic(1, seed=0, split="train")[0]
TINY = f"{TINY_SCHEME}llama?hidden=32&layers=1&heads=2&kv_heads=1&seed=0"


def prompt_text(row: dict) -> str:
    return str(TOKENIZER.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False))


@pytest.mark.parametrize(("layout", "call_format"), [("chat", "hermes"), ("short", "json")])
def test_a_call_demonstration_is_the_trajectory_the_agent_loop_builds(layout: str, call_format: str) -> None:
    row = arithmetic(1, seed=0, split="train", layout=layout)[0]
    demo = arithmetic_demonstration(row, TOKENIZER, RENDERER, call=True)
    prompt = prompt_text(row)
    product = row["reward_model"]["ground_truth"]
    call = row["extra_info"]["call"]
    # the same turns through the real loop and the real calculator in its worker process
    agent = AgentLoop(
        Agent.model_validate({"tools": [{"name": "calculator"}], "maxTurns": 3, "callFormat": call_format}),
        TOKENIZER,
        eos_ids=[TOKENIZER.eos_token_id],
        pad_id=TOKENIZER.pad_token_id,
        max_response_length=400,
    )
    try:
        prompt_ids = list(TOKENIZER.encode(prompt, add_special_tokens=False))
        rows = agent.generate([prompt_ids], 1, ScriptedPolicy({prompt: [call + "<|im_end|>", product + "<|im_end|>"]}))
    finally:
        agent.close()
    response = demo.ids[len(prompt_ids) :]
    assert demo.ids[: len(prompt_ids)] == prompt_ids and not any(demo.loss_mask[: len(prompt_ids)])
    assert response == rows["responses"][0].tolist()
    # the loss covers the policy's tokens; the eos that closes the call turn is the policy's in the demonstration
    # (so generation stops there) and the renderer's glue in the loop, which cuts the turn at the call
    call_end = len(TOKENIZER.encode(call, add_special_tokens=False))
    expected = rows["response_mask"][0].tolist()
    expected[call_end] = 1
    assert demo.loss_mask[len(prompt_ids) :] == expected
    assert TOKENIZER.decode(response) == (
        f"{call}<|im_end|>\n<|im_start|>tool\n{product}<|im_end|>\n<|im_start|>assistant\n{product}<|im_end|>"
    )


def test_short_rows_are_solved_by_their_json_call_at_fixed_lengths() -> None:
    """What the tiny policy copies sits at a fixed distance: 6-character expressions, 5-digit products."""
    for row in arithmetic(200, seed=0, split="train", layout="short"):
        expression = row["prompt"][0]["content"]
        call = find_call(row["extra_info"]["call"], "json")
        assert call is not None and call.name == "calculator" and not call.problem
        assert call.arguments == {"expression": expression} and len(expression) == 6
        assert calculator(expression) == row["reward_model"]["ground_truth"] and len(calculator(expression)) == 5
    with pytest.raises(ValueError, match="layout 'long'"):
        arithmetic(1, seed=0, split="train", layout="long")


def test_a_direct_demonstration_answers_the_product_at_once() -> None:
    demo = arithmetic_demonstration(ROW, TOKENIZER, RENDERER, call=False)
    prompt_length = len(TOKENIZER.encode(prompt_text(ROW), add_special_tokens=False))
    assert TOKENIZER.decode(demo.ids[prompt_length:]) == ROW["reward_model"]["ground_truth"] + "<|im_end|>"
    assert demo.loss_mask == [0] * prompt_length + [1] * (len(demo.ids) - prompt_length)


def test_a_row_whose_ground_truth_is_not_the_product_is_refused() -> None:
    row = {**ROW, "reward_model": {"style": "rule", "ground_truth": "7"}}
    with pytest.raises(ValueError, match="the ground truth is '7'; not a kuberl data arithmetic row"):
        arithmetic_demonstration(row, TOKENIZER, RENDERER, call=True)


def test_a_row_without_its_call_is_refused() -> None:
    row = {**ROW, "extra_info": {k: v for k, v in ROW["extra_info"].items() if k != "call"}}
    with pytest.raises(ValueError, match=r"no extra_info\.call to demonstrate"):
        arithmetic_demonstration(row, TOKENIZER, RENDERER, call=True)


def test_bad_warm_up_settings_name_the_setting() -> None:
    model = load_causal_lm(TINY, torch.float32)
    with pytest.raises(ValueError, match=r"call_share=1\.5"):
        warm_up(model, TOKENIZER, [ROW], call_share=1.5, steps=1)


def test_warm_up_lowers_the_loss_and_the_saved_folder_loads_by_path(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = load_causal_lm(TINY, torch.float32)
    losses = warm_up(
        model, TOKENIZER, arithmetic(8, seed=0, split="warmup"), call_share=0.5, steps=8, batch_size=4, lr=1e-2
    )
    assert len(losses) == 8 and losses[-1] < 0.75 * losses[0]
    loaded = load_causal_lm(str(save_policy(model, TOKENIZER, tmp_path / "policy")), torch.float32)
    ids = torch.tensor([TOKENIZER.encode(prompt_text(ROW), add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_the_warm_up_command_writes_a_policy_that_loads_by_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "warm"
    assert main([str(out), "--model", TINY, "--rows", "8", "--steps", "2", "--batch-size", "2"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert load_causal_lm(str(out), torch.float32).config.hidden_size == 32
