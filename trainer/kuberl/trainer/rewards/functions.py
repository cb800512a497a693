"""Reward functions: builtin rules registered by name, and user functions with verl's signature.

A reward function is called as ``fn(data_source, solution_str, ground_truth, extra_info)`` (verl's
``compute_score`` signature, so verl users' functions drop in) and returns a number, a bool, or a dict with
``"score"`` plus other keys to log. It may be ``async def``; a batch of async calls runs concurrently.
"""

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

RewardFunction = Callable[[str, str, str, dict[str, Any]], Any]
BUILTINS: dict[str, RewardFunction] = {}
Registered = TypeVar("Registered", bound=RewardFunction)


class RewardFunctionError(RuntimeError):
    """A reward function failed on a sample or returned something that is not a score."""


class RewardTimeoutError(RewardFunctionError):
    """A batch of reward-function calls ran past ``reward.timeoutSeconds``; the function's process was killed."""


class NonFiniteRewardError(RewardFunctionError):
    """A score is NaN or infinite in the training dtype (:data:`SCORE_DTYPE`), or beyond :data:`MAX_ABS_SCORE`."""


class RewardFunctionLoadError(ValueError):
    """``reward.function`` names nothing callable."""


SCORE_DTYPE = torch.float32
"""The dtype scores are trained in: finiteness is checked after the cast to it."""
MAX_ABS_SCORE = 1e6
"""The largest score magnitude accepted: far beyond any reward scale in use, and far below where a group's statistics
in float32 overflow (a score of 3e38 is finite, yet its group's variance is not and every advantage becomes 0)."""
ERROR_KEY = "reward_error"
"""With ``onError: zero``, the extra that is 1 for a sample the function raised on (scored 0), else 0: its batch
mean is the metric ``reward_extra/reward_error/mean``."""
OnError = Literal["fail", "zero"]
LOAD_SECONDS = 120.0
"""How long the reward process may take to start and import the function (``reward.timeoutSeconds`` if longer): a
spawned interpreter imports torch, and the function's module may import heavy libraries."""


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
