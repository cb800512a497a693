"""Multi-turn rollouts: the policy calls tools (or acts in an environment) over several turns.

The loop (``rollout.agent``, docs/agentic.md), batched per turn over the trajectories still running:

1. generate one turn for every active trajectory (context = prompt + everything so far) through the single-turn
   rollout (``hf`` or ``vllm``, colocated or separate), at most the trajectory's remaining token budget;
2. a turn ends at eos or right after the first complete tool call (vLLM stops there by stop string; ``hf`` generates
   on and the loop cuts the turn at the call's last token);
3. run every call of the turn in the tool worker pool (:mod:`kuberl.trainer.rollout.tools`: other processes, with
   timeouts and a memory limit), concurrently; errors and timeouts become observations that name the call;
4. append each observation as a tool turn (the chat template's tool role, or a plain ``<tool_response>`` block),
   masked out of the loss;
5. stop a trajectory at a turn without a call, after ``maxTurns`` policy turns, or when ``data.maxResponseLength``
   tokens (policy and observation tokens together) are spent.

The result has the trainer's row layout: ``response_mask`` is 1 on policy-generated tokens only, so tool outputs
and template glue are excluded from the loss, the KL and the advantages; ``response_attention_mask`` is 1 on every
real response token, so the policy's log-probs are computed with the observations in context.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from kuberl.api.spec import Agent
from kuberl.trainer.model.microbatch import Rows
from kuberl.trainer.rollout.base import left_pad
from kuberl.trainer.rollout.tools import Request, Result, ToolPool

TurnGenerator = Callable[[list[list[int]], int, tuple[str, ...]], Rows]
"""``(contexts, max_new_tokens, stop strings)`` → single-turn rows, one response per context."""

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
HERMES_STOP = "</tool_call>"
PLAIN_OBSERVATION = ("\n<tool_response>\n", "\n</tool_response>\n")
INVALID_CALL = "invalid_call"
"""Metrics name of calls that did not parse or named no declared tool."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    end: int
    """Character offset just past the call in the turn's text."""
    problem: str = ""
    """Why the call cannot run (malformed JSON, unknown tool); empty when it can."""

    def describe(self) -> str:
        return f"{self.name}({json.dumps(self.arguments)})"


def as_call(payload: Any, end: int) -> ToolCall:
    """``{"name": str, "arguments": dict | JSON string of a dict}``, or a call that carries its problem."""
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCall(INVALID_CALL, {}, end, 'a tool call is {"name": ..., "arguments": {...}}')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return ToolCall(payload["name"], {}, end, "arguments must be a JSON object")
    return ToolCall(payload["name"], arguments, end)


def find_call(text: str, call_format: str) -> ToolCall | None:
    """The first complete tool call in ``text``, or None."""
    if call_format == "hermes":
        match = HERMES_CALL.search(text)
        if match is None:
            return None
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError as e:
            return ToolCall(INVALID_CALL, {}, match.end(), f"the tool call is not JSON ({e})")
        return as_call(payload, match.end())
    decoder = json.JSONDecoder()
    for start in (i for i, c in enumerate(text) if c == "{"):
        try:
            payload, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(payload, dict) and "name" in payload:
            return as_call(payload, end)
    return None


class ObservationRenderer:
    """Token ids of a tool turn. ``chat_template``: the text the tokenizer's template puts between an assistant
    message and the next generation prompt around a ``tool`` message (e.g. ChatML's ``<|im_end|>\\n<|im_start|>tool\\n
    …<|im_end|>\\n<|im_start|>assistant\\n``), found by rendering a marker conversation once. The output is
    tokenized on its own with special tokens split, so a tool cannot inject template tokens."""

    MARK, OUT = "KUBERLASSISTANTMARK", "KUBERLTOOLOUTPUTMARK"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, observation_format: str) -> None:
        self.tokenizer = tokenizer
        if observation_format == "plain":
            self.before, self.after = PLAIN_OBSERVATION
            self.eos_text = ""
            return
        chat = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": self.MARK},
            {"role": "tool", "content": self.OUT},
        ]
        try:
            text = str(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
        except Exception as e:
            raise ValueError(
                f"rollout.agent.observationFormat chat_template: the tokenizer's chat template cannot render a tool "
                f"message ({type(e).__name__}: {e}); use observationFormat: plain"
            ) from e
        if self.MARK not in text or self.OUT not in text:
            raise ValueError(
                "rollout.agent.observationFormat chat_template: the tokenizer's chat template drops tool messages; "
                "use observationFormat: plain"
            )
        self.before, self.after = text[text.index(self.MARK) + len(self.MARK) :].split(self.OUT)
        self.eos_text = str(tokenizer.eos_token or "")

    def ids(self, output: str, *, after_eos: bool) -> list[int]:
        """``after_eos``: the policy closed its turn itself, so the template's own turn end is not repeated."""
        before = self.before
        if after_eos and self.eos_text and before.startswith(self.eos_text):
            before = before[len(self.eos_text) :]
        encode = self.tokenizer.encode
        return [
            *encode(before, add_special_tokens=False),
            *self.tokenizer(output, add_special_tokens=False, split_special_tokens=True)["input_ids"],
            *encode(self.after, add_special_tokens=False),
        ]


@dataclass
class Trajectory:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    """1 on policy tokens, 0 on observation tokens."""
    log_probs: list[float] = field(default_factory=list)
    turns: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Per tool call (or environment step): tool, arguments, ok, timed_out, seconds, output or error."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The turns as chat messages: assistant (policy text, special tokens dropped) and tool (observation text)."""
    environment_reward: float = 0.0
    stop: str = ""
    """Why it ended: eos, no_call, max_turns, budget, environment_done, environment_error."""
    key: str = ""
    """The environment instance's key in its tool worker."""

    @property
    def done(self) -> bool:
        return bool(self.stop)

    def extend(self, ids: list[int], policy: bool, log_probs: list[float] | None = None) -> None:
        self.tokens.extend(ids)
        self.mask.extend([int(policy)] * len(ids))
        self.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))


class AgentLoop:
    """Runs ``rollout.agent`` on the driver; holds the tool workers and the trajectories of the last batch (the
    reward step reads them)."""

    def __init__(
        self,
        agent: Agent,
        tokenizer: PreTrainedTokenizerBase,
        *,
        eos_ids: list[int],
        pad_id: int,
        max_response_length: int,
        pool: ToolPool | None = None,
    ) -> None:
        self.agent = agent
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.pad_id = pad_id
        self.budget = max_response_length
        self.renderer = ObservationRenderer(tokenizer, agent.observation_format)
        self.tools = {t.name: t for t in agent.tools}
        env = agent.environment
        self.pool = pool or ToolPool(
            {t.name: t.function or t.name for t in agent.tools},
            environment=env.class_path if env else None,
            workers=agent.workers,
            memory_limit_mb=agent.memory_limit_mb,
        )
        self.prompt_info: dict[tuple[int, ...], dict[str, Any]] = {}
        self.last: list[Trajectory] = []

    def register_prompts(self, prompts: list[tuple[list[int], dict[str, Any]]]) -> None:
        """Token ids → what an environment's ``reset`` receives as ``extra_info`` for that prompt."""
        self.prompt_info.update({tuple(ids): info for ids, info in prompts})

    @property
    def stops(self) -> tuple[str, ...]:
        return (HERMES_STOP,) if self.tools and self.agent.call_format == "hermes" else ()

    # --- the loop ---------------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], n: int, generate_turn: TurnGenerator) -> Rows:
        trajectories = [Trajectory(list(p), key=f"{i}") for i, p in enumerate(p for p in prompts for _ in range(n))]
        if self.agent.environment is not None:
            self.reset(trajectories)
        while active := [t for t in trajectories if not t.done]:
            rows = generate_turn(
                [t.prompt + t.tokens for t in active], max(self.budget - len(t.tokens) for t in active), self.stops
            )
            pending = [self.take_turn(t, *turn) for t, turn in zip(active, self.turn_outputs(rows), strict=True)]
            self.answer([(t, a) for t, a in zip(active, pending, strict=True) if a is not None])
        self.last = trajectories
        return self.to_rows(trajectories)

    def turn_outputs(self, rows: Rows) -> list[tuple[list[int], list[float] | None]]:
        out = []
        for i in range(len(rows["responses"])):
            valid = rows["response_mask"][i].bool()
            log_probs = rows["rollout_log_probs"][i][valid].tolist() if "rollout_log_probs" in rows else None
            out.append((rows["responses"][i][valid].tolist(), log_probs))
        return out

    def take_turn(self, t: Trajectory, ids: list[int], log_probs: list[float] | None) -> ToolCall | str | None:
        """Append one policy turn; the call to answer (tools), the action text (environment), or None when the
        trajectory ended."""
        ids = ids[: self.budget - len(t.tokens)]
        call = None
        if self.tools:
            call = find_call(self.decode(ids, special=True), self.agent.call_format)
            if call is not None:
                ids = ids[: self.call_end(ids)]
        if log_probs is not None:
            log_probs = log_probs[: len(ids)]
        t.extend(ids, True, log_probs)
        t.messages.append({"role": "assistant", "content": self.decode(ids, special=False)})
        t.turns += 1
        ended_by_eos = bool(ids) and ids[-1] in self.eos_ids
        if self.tools and call is None:
            t.stop = "eos" if ended_by_eos else "budget" if len(t.tokens) >= self.budget else "no_call"
            return None
        if len(t.tokens) >= self.budget:
            t.stop = "budget"
        elif t.turns >= self.agent.max_turns:
            t.stop = "max_turns"
        if call is not None:
            return None if t.done else call
        # an environment sees every turn, the last one too: its step reward counts
        return t.messages[-1]["content"]

    def decode(self, ids: list[int], *, special: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=not special))

    def call_end(self, ids: list[int]) -> int:
        """Fewest leading tokens whose text holds the whole first call (binary search: decoding is monotone)."""
        low, high = 1, len(ids)
        while low < high:
            mid = (low + high) // 2
            text = self.decode(ids[:mid], special=True)
            if find_call(text, self.agent.call_format) is None:
                low = mid + 1
            else:
                high = mid
        return low

    # --- tools and environments -------------------------------------------------------------------------------

    def answer(self, pending: list[tuple[Trajectory, ToolCall | str]]) -> None:
        """Run the turn's calls (or environment steps) together, then append every observation."""
        requests: list[Request] = []
        waiting: list[tuple[Trajectory, ToolCall | str]] = []
        for t, action in pending:
            if isinstance(action, str):
                payload: dict[str, Any] = {"key": t.key, "action": action}
                requests.append(Request("step", payload, self.agent.environment.timeout_seconds, self.worker_of(t)))  # type: ignore[union-attr]
                waiting.append((t, action))
            elif not action.problem and action.name not in self.tools:
                problem = f"unknown tool {action.name!r}; tools: {sorted(self.tools)}"
                self.observe(t, ToolCall(action.name, action.arguments, action.end, problem), None)
            elif action.problem:
                self.observe(t, action, None)
            else:
                tool = self.tools[action.name]
                payload = {"tool": action.name, "arguments": action.arguments}
                requests.append(Request("call", payload, tool.timeout_seconds))
                waiting.append((t, action))
        for (t, action), result in zip(waiting, self.pool.run(requests), strict=True):
            if isinstance(action, str):
                self.observe_environment(t, result)
            else:
                self.observe(t, action, result)

    def observe(self, t: Trajectory, call: ToolCall, result: Result | None) -> None:
        record: dict[str, Any] = {"tool": call.name, "arguments": call.arguments, "seconds": 0.0}
        limit = self.tools[call.name].max_output_chars if call.name in self.tools else 1024
        if result is None:
            text = f"error: {call.problem}"
            record.update(ok=False, timed_out=False, error=call.problem)
        elif result.ok:
            text = (result.output or "")[:limit]
            record.update(ok=True, timed_out=False, output=text, seconds=result.seconds)
        else:
            why = f"timed out after {self.tools[call.name].timeout_seconds:g} s" if result.timed_out else result.error
            text = f"error: {call.describe()} {'' if result.timed_out else 'raised '}{why}"
            record.update(ok=False, timed_out=result.timed_out, error=why, seconds=result.seconds)
        t.calls.append(record)
        self.append_observation(t, text[:limit])

    def observe_environment(self, t: Trajectory, result: Result) -> None:
        env = self.agent.environment
        assert env is not None, "environment steps only with an environment"
        t.calls.append(
            {
                "tool": "environment",
                "ok": result.ok,
                "timed_out": result.timed_out,
                "seconds": result.seconds,
                **({"reward": result.reward} if result.ok else {"error": result.error}),
            }
        )
        if not result.ok:
            t.stop = "environment_error"
            return
        t.environment_reward += result.reward
        if result.done:
            t.stop = "environment_done"
        if not t.done:
            self.append_observation(t, (result.output or "")[: env.max_output_chars])

    def append_observation(self, t: Trajectory, text: str) -> None:
        ended_by_eos = bool(t.tokens) and t.tokens[-1] in self.eos_ids
        t.messages.append({"role": "tool", "content": text})
        ids = self.renderer.ids(text, after_eos=ended_by_eos)
        room = self.budget - len(t.tokens)
        t.extend(ids[:room], False)
        if len(ids) >= room:
            t.stop = "budget"

    def worker_of(self, t: Trajectory) -> int:
        return int(t.key) % len(self.pool.workers)

    def reset(self, trajectories: list[Trajectory]) -> None:
        env = self.agent.environment
        assert env is not None, "reset only with an environment"
        requests = [
            Request(
                "reset",
                {
                    "key": t.key,
                    "prompt": self.decode(t.prompt, special=False),
                    "extra_info": self.prompt_info.get(tuple(t.prompt), {}),
                },
                env.timeout_seconds,
                self.worker_of(t),
            )
            for t in trajectories
        ]
        for t, result in zip(trajectories, self.pool.run(requests), strict=True):
            if not result.ok:
                raise RuntimeError(f"rollout.agent.environment {env.class_path}: reset failed: {result.error}")
            if result.output is not None:
                self.append_observation(t, result.output[: env.max_output_chars])

    # --- results ----------------------------------------------------------------------------------------------

    def to_rows(self, trajectories: list[Trajectory]) -> Rows:
        prompts, prompt_mask = left_pad([t.prompt for t in trajectories], self.pad_id)
        width = max(1, max(len(t.tokens) for t in trajectories))
        shape = (len(trajectories), width)
        responses = torch.full(shape, self.pad_id, dtype=torch.long)
        response_mask = torch.zeros(shape, dtype=torch.long)
        attention = torch.zeros(shape, dtype=torch.long)
        log_probs = torch.zeros(shape, dtype=torch.float32)
        for i, t in enumerate(trajectories):
            k = len(t.tokens)
            responses[i, :k] = torch.as_tensor(t.tokens, dtype=torch.long)
            response_mask[i, :k] = torch.as_tensor(t.mask, dtype=torch.long)
            attention[i, :k] = 1
            log_probs[i, :k] = torch.as_tensor(t.log_probs, dtype=torch.float32)
        rows = {
            "prompts": prompts,
            "prompt_mask": prompt_mask,
            "responses": responses,
            "response_mask": response_mask,
            "response_attention_mask": attention,
        }
        if trajectories[0].log_probs and any(any(t.log_probs) for t in trajectories):
            rows["rollout_log_probs"] = log_probs
        return rows

    def texts(self) -> list[str]:
        """Each trajectory's whole response (policy turns and observations), as the reward function sees it."""
        return [self.decode(t.tokens, special=False) for t in self.last]

    def trajectory_info(self, index: int) -> dict[str, Any]:
        """What the reward function finds under ``extra_info["trajectory"]``."""
        t = self.last[index]
        return {
            "turns": t.turns,
            "messages": t.messages,
            "calls": t.calls,
            "stop": t.stop,
            "environment_reward": t.environment_reward,
        }

    def environment_scores(self) -> torch.Tensor:
        return torch.tensor([t.environment_reward for t in self.last], dtype=torch.float32)

    def metrics(self) -> dict[str, float]:
        """agent/* metrics of the last batch: per trajectory, per call, per tool."""
        trajectories = self.last
        calls = [c for t in trajectories for c in t.calls]
        tokens = sum(len(t.tokens) for t in trajectories)
        out = {
            "agent/turns/mean": sum(t.turns for t in trajectories) / len(trajectories),
            "agent/turns/max": float(max(t.turns for t in trajectories)),
            "agent/tool_calls/mean": len(calls) / len(trajectories),
            "agent/tool_call_rate": sum(bool(t.calls) for t in trajectories) / len(trajectories),
            "agent/masked_token_share": sum(t.mask.count(0) for t in trajectories) / tokens if tokens else 0.0,
            "agent/tool_seconds/total": sum(c["seconds"] for c in calls),
        }
        if calls:
            out["agent/tool_error_rate"] = sum(not c["ok"] for c in calls) / len(calls)
            out["agent/tool_timeout_rate"] = sum(c["timed_out"] for c in calls) / len(calls)
        for stop in sorted({t.stop for t in trajectories}):
            out[f"agent/stop/{stop}"] = sum(t.stop == stop for t in trajectories) / len(trajectories)
        # metric names come from the declared tools only: a policy inventing names must not invent series
        by_tool: dict[str, list[dict[str, Any]]] = {}
        for c in calls:
            declared = c["tool"] in self.tools or c["tool"] == "environment"
            by_tool.setdefault(c["tool"] if declared else INVALID_CALL, []).append(c)
        for name, mine in sorted(by_tool.items()):
            out[f"agent/tool/{name}/calls"] = float(len(mine))
            out[f"agent/tool/{name}/error_rate"] = sum(not c["ok"] for c in mine) / len(mine)
            out[f"agent/tool/{name}/timeout_rate"] = sum(c["timed_out"] for c in mine) / len(mine)
            out[f"agent/tool/{name}/seconds/mean"] = sum(c["seconds"] for c in mine) / len(mine)
        return out

    def close(self) -> None:
        self.pool.close()
