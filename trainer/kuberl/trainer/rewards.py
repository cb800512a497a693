"""Reward functions: builtin rules registered by name, user functions with verl's signature, a reward model.

A reward function is called as ``fn(data_source, solution_str, ground_truth, extra_info)`` (verl's
``compute_score`` signature, so verl users' functions drop in) and returns a number, a bool, or a dict with
``"score"`` plus other keys to log. It may be ``async def``; a batch of async calls runs concurrently.
"""

import asyncio
import concurrent.futures
import importlib
import importlib.util
import inspect
import math
import numbers
import re
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from kuberl.trainer.models import load_sequence_classifier, load_tokenizer

RewardFunction = Callable[[str, str, str, dict[str, Any]], Any]
BUILTINS: dict[str, RewardFunction] = {}
Registered = TypeVar("Registered", bound=RewardFunction)


class RewardFunctionError(RuntimeError):
    """A reward function failed on a sample or returned something that is not a score."""


class RewardFunctionLoadError(ValueError):
    """``reward.function`` names nothing callable."""


@dataclass(frozen=True)
class RewardInput:
    data_source: str
    solution_str: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardOutput:
    score: float
    extra: dict[str, float] = field(default_factory=dict)


def register_reward(name: str) -> Callable[[Registered], Registered]:
    def register(fn: Registered) -> Registered:
        BUILTINS[name] = fn
        return fn

    return register


GSM8K_ANSWER = re.compile(r"#### (-?[0-9.,]+)")
GSM8K_TAIL_CHARS = 300


@register_reward("gsm8k")
def gsm8k(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """verl's strict GSM8K rule: the last ``#### <number>`` in the response, commas removed, must equal the ground
    truth as a string (1.0), anything else scores 0.0 (verl's default format score).

    Like verl, only the last 300 characters are searched, and the comparison is textual: ``#### 42.`` and
    ``#### 42.0`` do not match ``42``.
    """
    found = GSM8K_ANSWER.findall(solution_str[-GSM8K_TAIL_CHARS:])
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "") == str(ground_truth) else 0.0


@register_reward("exact_match")
def exact_match(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 when the response equals the ground truth after stripping surrounding whitespace."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


@register_reward("prefix_match")
def prefix_match(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 when the stripped response starts with the stripped ground truth.

    Used for ``kuberl/digits``: a tiny random model rarely stops on its own, so what follows the answer is ignored.
    """
    expected = str(ground_truth).strip()
    return 1.0 if expected and solution_str.strip().startswith(expected) else 0.0


FIRST_INTEGER = re.compile(r"-?\d+")


@register_reward("final_answer")
def final_answer(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 when the first integer of the policy's last turn equals the ground truth.

    Multi-turn rollouts (``rollout.agent``) pass the turns in ``extra_info["trajectory"]["messages"]``; the last
    assistant message is the answer, so a number that only the tool printed does not count. Single-turn: the
    whole response.
    """
    messages = ((extra_info or {}).get("trajectory") or {}).get("messages") or []
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    found = FIRST_INTEGER.search(answers[-1] if answers else solution_str)
    return 1.0 if found is not None and found.group() == str(ground_truth).strip() else 0.0


DISPATCH: dict[str, Callable[[str, str, str, dict[str, Any] | None], float]] = {
    "openai/gsm8k": gsm8k,
    "kuberl/gsm8k-synth": gsm8k,  # `kuberl data gsm8k-synth`: GSM8K's format, labelled as generated
    "kuberl/digits": prefix_match,
    "kuberl/arithmetic": final_answer,
}


@register_reward("default")
def default(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """The builtin rule for the row's ``data_source``, as verl's default dispatcher does."""
    rule = DISPATCH.get(data_source)
    if rule is None:
        raise RewardFunctionError(
            f"no builtin reward for data_source {data_source!r}; builtin data sources: {sorted(DISPATCH)}; "
            f"set reward.function to a builtin ({sorted(BUILTINS)}) or 'module:function'"
        )
    return rule(data_source, solution_str, ground_truth, extra_info)


def load_reward_function(name: str) -> RewardFunction:
    """A builtin by name, ``package.module:function`` from ``sys.path``, or ``path/to/file.py:function``."""
    if name in BUILTINS:
        return BUILTINS[name]
    target, sep, attribute = name.rpartition(":")
    if not sep or not target or not attribute:
        raise RewardFunctionLoadError(
            f"reward function {name!r} is neither a builtin ({sorted(BUILTINS)}) nor 'module:function' "
            "nor 'path/to/file.py:function'"
        )
    module = load_file(target, name) if target.endswith(".py") or "/" in target else import_module(target, name)
    if not hasattr(module, attribute):
        public = sorted(a for a in vars(module) if not a.startswith("_") and callable(getattr(module, a)))
        raise RewardFunctionLoadError(
            f"reward function {name!r}: {target} has no attribute {attribute!r}; callables there: {public}"
        )
    fn = getattr(module, attribute)
    if not callable(fn):
        raise RewardFunctionLoadError(f"reward function {name!r}: {attribute} is a {type(fn).__name__}, not callable")
    loaded: RewardFunction = fn
    return loaded


def import_module(module_name: str, name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise RewardFunctionLoadError(
            f"reward function {name!r}: cannot import {e.name!r}; install the package in the trainer image or "
            f"put its folder on PYTHONPATH (sys.path is {sys.path})"
        ) from e


def load_file(file_name: str, name: str) -> Any:
    path = Path(file_name).expanduser()
    if not path.is_file():
        raise RewardFunctionLoadError(
            f"reward function {name!r}: file {file_name!r} does not exist "
            "(mount it into the trainer pods, or use 'module:function')"
        )
    spec = importlib.util.spec_from_file_location(f"kuberl_reward_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise RewardFunctionLoadError(f"reward function {name!r}: {file_name!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def describe(fn: RewardFunction) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def failure(fn: RewardFunction, index: int, sample: RewardInput, problem: str) -> str:
    return (
        f"reward function {describe(fn)} {problem} on sample {index} (data_source={sample.data_source!r}, "
        f"ground_truth={sample.ground_truth!r}, solution[:200]={sample.solution_str[:200]!r})"
    )


def to_output(fn: RewardFunction, index: int, sample: RewardInput, value: Any) -> RewardOutput:
    """Numbers and bools are scores; a dict needs a numeric ``"score"``. Other numeric dict values become
    ``extra``; non-numeric ones (verl's math_dapo returns a string ``pred``) are not metrics and are left out."""
    extra: dict[str, float] = {}
    score = value
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardFunctionError(failure(fn, index, sample, f"returned a dict without 'score' ({sorted(value)})"))
        score = value["score"]
        extra = {k: float(v) for k, v in value.items() if k != "score" and isinstance(v, numbers.Real)}
    if not isinstance(score, numbers.Real) or not math.isfinite(float(score)):
        raise RewardFunctionError(
            failure(
                fn,
                index,
                sample,
                f"returned {score!r} ({type(score).__name__}); "
                "return a finite number, a bool, or a dict with a numeric 'score'",
            )
        )
    return RewardOutput(score=float(score), extra=extra)


def call(fn: RewardFunction, sample: RewardInput) -> Any:
    return fn(sample.data_source, sample.solution_str, sample.ground_truth, sample.extra_info)


def is_async(fn: RewardFunction) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def gather(fn: RewardFunction, samples: list[RewardInput]) -> list[Any]:
    return await asyncio.gather(*(call(fn, s) for s in samples), return_exceptions=True)


def run_async(awaitable: Coroutine[Any, Any, list[Any]]) -> list[Any]:
    """``asyncio.run``, or on a fresh thread when this thread already runs a loop (e.g. an async Ray actor)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(awaitable)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, awaitable).result()


def score_batch(fn: RewardFunction, samples: list[RewardInput]) -> list[RewardOutput]:
    """Score every sample; the first failure (in sample order) raises ``RewardFunctionError`` chained to its cause."""
    if is_async(fn):
        results = run_async(gather(fn, samples))
    else:
        results = []
        for index, sample in enumerate(samples):
            try:
                results.append(call(fn, sample))
            except Exception as e:
                raise RewardFunctionError(failure(fn, index, sample, f"raised {type(e).__name__}: {e}")) from e
    outputs = []
    for index, (sample, result) in enumerate(zip(samples, results, strict=True)):
        if isinstance(result, Exception):
            raise RewardFunctionError(
                failure(fn, index, sample, f"raised {type(result).__name__}: {result}")
            ) from result
        outputs.append(to_output(fn, index, sample, result))
    return outputs


class RewardModelScorer:
    """A sequence-classification reward model: one score per text, read at its last token.

    Texts are tokenized as given (apply the reward model's own chat template first), right-padded and truncated on
    the right to ``max_length``, and scored in micro-batches of ``micro_batch_size``. The last token is located
    from the attention mask rather than by searching for the pad id, which fails when pad and eos share an id.
    """

    def __init__(
        self,
        path: str,
        *,
        micro_batch_size: int,
        dtype: torch.dtype,
        max_length: int,
        device: str | torch.device = "cpu",
    ) -> None:
        if micro_batch_size < 1 or max_length < 1:
            raise ValueError(
                f"reward model {path!r}: micro_batch_size ({micro_batch_size}) and max_length "
                f"({max_length}) must be ≥ 1"
            )
        self.model = load_sequence_classifier(path, dtype)
        module: torch.nn.Module = self.model  # nn.Module.to's signature: transformers' override is untyped
        module.to(device).eval()
        if not hasattr(self.model, "score"):
            raise ValueError(
                f"reward model {path!r} ({type(self.model).__name__}) has no 'score' head; use a "
                "decoder saved as AutoModelForSequenceClassification"
            )
        self.tokenizer = load_tokenizer(path)
        self.tokenizer.padding_side = "right"
        self.tokenizer.truncation_side = "right"
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length
        self.device = torch.device(device)

    @torch.inference_mode()
    def score(self, texts: list[str]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(texts), self.micro_batch_size):
            batch = self.tokenizer(
                texts[start : start + self.micro_batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = getattr(self.model, self.model.base_model_prefix)(**batch).last_hidden_state
            last = batch["attention_mask"].sum(dim=-1) - 1
            pooled = hidden[torch.arange(hidden.shape[0], device=self.device), last]
            scores.extend(self.model.get_submodule("score")(pooled)[:, 0].float().tolist())
        return scores
