"""The agent loop against a scripted policy: turns, masks, limits, tool isolation, environments.

The tiny tokenizer is character-level with a ChatML template, so every expected token sequence below is the text
written out: ``enc("abc")`` is one id per character.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kuberl.api.spec import Agent
from kuberl.trainer.experience.batch import place_at_last_token
from kuberl.trainer.model.loading import tiny_tokenizer
from kuberl.trainer.model.microbatch import Rows, lengths, model_inputs
from kuberl.trainer.rollout.agent import AgentLoop, find_call

TOKENIZER = tiny_tokenizer()
EOS = TOKENIZER.eos_token_id
PAD = TOKENIZER.pad_token_id
OBSERVATION = "<|im_end|>\n<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n"
"""ChatML's tool turn after a policy turn cut at its call (no eos of its own)."""


def enc(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False))


def call(expression: str, name: str = "calculator") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


class ScriptedPolicy:
    """Answers each context with the next scripted turn of its trajectory (found by its prompt), cut at the
    requested budget; records every call."""

    def __init__(self, scripts: dict[str, list[str]]) -> None:
        self.turns = {tuple(enc(prompt)): list(turns) for prompt, turns in scripts.items()}
        self.calls: list[tuple[list[list[int]], int, tuple[str, ...]]] = []

    def __call__(self, contexts: list[list[int]], budget: int, stop: tuple[str, ...]) -> Rows:
        self.calls.append((contexts, budget, stop))
        out = []
        for context in contexts:
            prompt = next(p for p in self.turns if tuple(context[: len(p)]) == p)
            out.append(enc(self.turns[prompt].pop(0))[:budget])
        width = max(len(o) for o in out)
        responses = torch.full((len(out), width), PAD)
        mask = torch.zeros((len(out), width), dtype=torch.long)
        for i, ids in enumerate(out):
            responses[i, : len(ids)] = torch.tensor(ids)
            mask[i, : len(ids)] = 1
        return {"prompts": responses, "prompt_mask": mask, "responses": responses, "response_mask": mask}


def loop(agent: dict[str, Any], budget: int = 400) -> AgentLoop:
    return AgentLoop(Agent.model_validate(agent), TOKENIZER, eos_ids=[EOS], pad_id=PAD, max_response_length=budget)


CALCULATOR = {"tools": [{"name": "calculator"}], "maxTurns": 3}


@pytest.fixture
def calculator_loop() -> Iterator[AgentLoop]:
    agent = loop(CALCULATOR)
    yield agent
    agent.close()


def test_tool_output_is_masked_and_the_turn_is_cut_after_the_call(calculator_loop: AgentLoop) -> None:
    policy = ScriptedPolicy({"Q": [call("12*34") + "ignored<|im_end|>", "408<|im_end|>"]})
    rows = calculator_loop.generate([enc("Q")], 1, policy)

    first, observation, second = enc(call("12*34")), enc(OBSERVATION.format("408")), enc("408<|im_end|>")
    assert rows["responses"][0].tolist() == first + observation + second
    assert rows["response_mask"][0].tolist() == [1] * len(first) + [0] * len(observation) + [1] * len(second)
    assert rows["response_attention_mask"][0].tolist() == [1] * (len(first) + len(observation) + len(second))
    assert policy.calls[1][0] == [enc("Q") + first + observation]  # the second turn sees the tool's answer
    assert policy.calls[0][2] == ("</tool_call>",)
    t = calculator_loop.last[0]
    assert (t.turns, t.stop, t.calls[0]["output"]) == (2, "eos", "408")
    assert calculator_loop.texts() == [call("12*34") + "\ntool\n408\nassistant\n408"]
    metrics = calculator_loop.metrics()
    assert metrics["agent/turns/mean"] == 2 and metrics["agent/tool_calls/mean"] == 1
    assert metrics["agent/masked_token_share"] == pytest.approx(len(observation) / len(rows["responses"][0]))
    assert metrics["agent/tool/calculator/error_rate"] == 0


def test_reward_lands_on_the_last_policy_token_and_observations_are_attended(calculator_loop: AgentLoop) -> None:
    policy = ScriptedPolicy({"Q": [call("1+1"), "2<|im_end|>"], "R": ["no tool<|im_end|>"]})
    rows = calculator_loop.generate([enc("Q"), enc("R")], 1, policy)
    rewards = place_at_last_token(torch.tensor([1.0, 2.0]), rows["response_mask"])
    last_q = len(enc(call("1+1"))) + len(enc(OBSERVATION.format("2"))) + len(enc("2<|im_end|>")) - 1
    assert rewards[0].nonzero().flatten().tolist() == [last_q]
    assert rewards[1].nonzero().flatten().tolist() == [len(enc("no tool<|im_end|>")) - 1]
    _, response_lengths = lengths(rows)
    assert response_lengths.tolist() == [last_q + 1, len(enc("no tool<|im_end|>"))]
    _, attention, _ = model_inputs(rows)
    assert attention[0, -len(rows["responses"][0]) :].sum() == last_q + 1  # tool tokens are context


def test_max_turns_ends_the_trajectory_without_running_the_last_call() -> None:
    agent = loop({"tools": [{"name": "calculator"}], "maxTurns": 2})
    try:
        policy = ScriptedPolicy({"Q": [call("1+1"), call("2+2"), "never"]})
        rows = agent.generate([enc("Q")], 1, policy)
    finally:
        agent.close()
    t = agent.last[0]
    assert (t.turns, t.stop, len(t.calls)) == (2, "max_turns", 1)
    first, observation, second = enc(call("1+1")), enc(OBSERVATION.format("2")), enc(call("2+2"))
    assert rows["response_mask"][0].tolist() == [1] * len(first) + [0] * len(observation) + [1] * len(second)


def test_the_token_budget_covers_policy_and_tool_tokens() -> None:
    first = enc(call("1+1"))
    budget = len(first) + 10  # the observation does not fit
    agent = loop(CALCULATOR, budget=budget)
    try:
        policy = ScriptedPolicy({"Q": [call("1+1"), "unused"]})
        rows = agent.generate([enc("Q")], 1, policy)
    finally:
        agent.close()
    assert agent.last[0].stop == "budget"
    assert rows["responses"].shape[1] == budget
    assert rows["response_mask"][0].tolist() == [1] * len(first) + [0] * 10
    assert policy.calls[0][1] == budget and len(policy.calls) == 1


def test_each_turn_gets_the_largest_remaining_budget_and_cuts_each_sample_to_its_own() -> None:
    agent = loop(CALCULATOR, budget=120)
    try:
        long_answer = "x" * 200
        policy = ScriptedPolicy({"A": [call("1+1"), long_answer], "B": [long_answer]})
        rows = agent.generate([enc("A"), enc("B")], 1, policy)
    finally:
        agent.close()
    assert [len(c) for c, _, _ in policy.calls] == [2, 1]  # turn 2 batches only the sample still running
    assert policy.calls[0][1] == 120
    assert rows["response_attention_mask"].sum(-1).tolist() == [120, 120]
    assert [t.stop for t in agent.last] == ["budget", "budget"]


def test_a_tool_that_raises_is_an_observation_naming_the_call(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text("def lookup(key):\n    raise KeyError(key)\n")
    agent = loop({"tools": [{"name": "lookup", "function": f"{tmp_path}/mytools.py:lookup"}]})
    try:
        policy = ScriptedPolicy({"Q": ['<tool_call>{"name": "lookup", "arguments": {"key": "k1"}}</tool_call>', "."]})
        agent.generate([enc("Q")], 1, policy)
    finally:
        agent.close()
    observation = str(TOKENIZER.decode(policy.calls[1][0][0], skip_special_tokens=True))
    assert observation.endswith('error: lookup({"key": "k1"}) raised KeyError: \'k1\'\nassistant\n')
    assert agent.metrics()["agent/tool_error_rate"] == 1.0


def test_a_tool_past_its_timeout_is_killed_and_reported(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\n\ndef wait(seconds):\n    time.sleep(seconds)\n    return 'done'\n")
    tool = {"name": "wait", "function": f"{tmp_path}/slow.py:wait", "timeoutSeconds": 0.5}
    agent = loop({"tools": [tool], "workers": 1})
    wait = '<tool_call>{"name": "wait", "arguments": {"seconds": %s}}</tool_call>'
    try:
        policy = ScriptedPolicy({"Q": [wait % 30, wait % 0, "."]})
        start = time.monotonic()
        agent.generate([enc("Q")], 1, policy)
        elapsed = time.monotonic() - start
    finally:
        agent.close()
    calls = agent.last[0].calls
    assert calls[0]["timed_out"] and calls[0]["error"] == "timed out after 0.5 s"
    assert calls[1]["ok"] and calls[1]["output"] == "done"  # the killed worker was replaced
    assert elapsed < 10
    assert agent.metrics()["agent/tool_timeout_rate"] == 0.5


def test_a_call_that_is_not_json_or_names_no_tool_is_an_error_observation(calculator_loop: AgentLoop) -> None:
    policy = ScriptedPolicy(
        {
            "Q": ["<tool_call>{calculator: 1+1}</tool_call>", "."],
            "R": ['<tool_call>{"name": "search", "arguments": {}}</tool_call>', "."],
        }
    )
    calculator_loop.generate([enc("Q"), enc("R")], 1, policy)
    q, r = (TOKENIZER.decode(c, skip_special_tokens=True) for c in policy.calls[1][0])
    assert "error: the tool call is not JSON" in q
    assert "error: unknown tool 'search'; tools: ['calculator']" in r
    metrics = calculator_loop.metrics()
    assert metrics["agent/tool/invalid_call/calls"] == 2  # an invented tool name makes no series of its own
    assert not any(name.startswith("agent/tool/search/") for name in metrics)


def test_tool_output_is_cut_to_max_output_chars() -> None:
    agent = loop({"tools": [{"name": "python_expr", "maxOutputChars": 5}]})
    try:
        policy = ScriptedPolicy({"Q": [call("'a' * 100", "python_expr"), "."]})
        agent.generate([enc("Q")], 1, policy)
    finally:
        agent.close()
    assert agent.last[0].calls[0]["output"] == "aaaaa"


def test_json_call_format_finds_a_bare_object() -> None:
    found = find_call('I will compute {"name": "calculator", "arguments": {"expression": "2*3"}} now', "json")
    assert found is not None and (found.name, found.arguments) == ("calculator", {"expression": "2*3"})
    assert found.end == len('I will compute {"name": "calculator", "arguments": {"expression": "2*3"}}')
    assert find_call("no call {here}", "json") is None


ENVIRONMENT = """
class Countdown:
    def reset(self, prompt, extra_info):
        self.left = int(extra_info["start"])
        return f"left {self.left}"

    def step(self, action):
        self.left -= 1
        return f"left {self.left}", 0.5, self.left == 0
"""


def test_environment_rewards_are_summed_and_observations_masked(tmp_path: Path) -> None:
    (tmp_path / "countdown.py").write_text(ENVIRONMENT)
    agent = loop({"environment": {"class": f"{tmp_path}/countdown.py:Countdown"}, "maxTurns": 5})
    agent.register_prompts([(enc("Q"), {"start": 2})])
    try:
        policy = ScriptedPolicy({"Q": ["go<|im_end|>", "go<|im_end|>", "never"]})
        rows = agent.generate([enc("Q")], 1, policy)
    finally:
        agent.close()
    # reset's observation opens the response; after an eos-ended turn ChatML's own <|im_end|> is not repeated
    reset = enc("<|im_end|>\n<|im_start|>tool\nleft 2<|im_end|>\n<|im_start|>assistant\n")
    step = enc("\n<|im_start|>tool\nleft 1<|im_end|>\n<|im_start|>assistant\n")
    go = enc("go<|im_end|>")
    assert rows["responses"][0].tolist() == reset + go + step + go
    assert rows["response_mask"][0].tolist() == [0] * len(reset) + [1] * len(go) + [0] * len(step) + [1] * len(go)
    assert agent.environment_scores().tolist() == [1.0]
    assert agent.last[0].stop == "environment_done"


def test_final_answer_scores_the_last_policy_turn_not_the_tool_output(calculator_loop: AgentLoop) -> None:
    from kuberl.trainer.rewards.functions import final_answer

    policy = ScriptedPolicy({"Q": [call("12*34"), "It is 408<|im_end|>"], "R": [call("12*34"), "no idea<|im_end|>"]})
    calculator_loop.generate([enc("Q"), enc("R")], 1, policy)
    texts = calculator_loop.texts()
    scores = [
        final_answer("kuberl/arithmetic", text, "408", {"trajectory": calculator_loop.trajectory_info(i)})
        for i, text in enumerate(texts)
    ]
    assert "408" in texts[1]  # the tool printed it, the policy did not say it
    assert scores == [1.0, 0.0]
    assert calculator_loop.trajectory_info(0)["messages"] == [
        {"role": "assistant", "content": call("12*34")},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "It is 408"},
    ]
