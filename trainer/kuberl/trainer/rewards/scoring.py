"""Scoring a batch with a reward function: outputs checked (a number, finite in float32, the dtype the scores are
trained in: ``1e39`` is finite in float64 only, and within ±:data:`~kuberl.trainer.rewards.functions.MAX_ABS_SCORE`),
async functions run concurrently, ``reward.onError`` applied.
Builtins are scored in the driver (:class:`InProcessScorer`)."""

import asyncio
import concurrent.futures
import inspect
import logging
import math
import numbers
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import torch

from kuberl.trainer.rewards.functions import (
    ERROR_KEY,
    MAX_ABS_SCORE,
    SCORE_DTYPE,
    NonFiniteRewardError,
    OnError,
    RewardFunction,
    RewardFunctionError,
    RewardInput,
    RewardOutput,
    describe,
)

log = logging.getLogger(__name__)


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
    if not isinstance(score, numbers.Real):
        raise RewardFunctionError(
            failure(
                fn,
                index,
                sample,
                f"returned {score!r} ({type(score).__name__}); "
                "return a finite number, a bool, or a dict with a numeric 'score'",
            )
        )
    if not in_score_range(score):
        raise NonFiniteRewardError(
            failure(fn, index, sample, f"returned {score!r:.60}, which is {as_score_dtype(score)} in {SCORE_DTYPE}")
            + f"; return a finite score within ±{MAX_ABS_SCORE:g}"
        )
    return RewardOutput(score=float(score), extra=extra)


def as_score_dtype(value: numbers.Real) -> float:
    """``value`` cast to :data:`SCORE_DTYPE` (an integer too large for a float is infinite)."""
    try:
        number = float(value)
    except OverflowError:
        number = -math.inf if isinstance(value, int) and value < 0 else math.inf
    return float(torch.tensor(number, dtype=SCORE_DTYPE))


def in_score_range(value: numbers.Real) -> bool:
    score = as_score_dtype(value)
    return math.isfinite(score) and abs(score) <= MAX_ABS_SCORE


def check_finite(scores: torch.Tensor, data_sources: list[str], source: str) -> None:
    """Raise :class:`NonFiniteRewardError` naming the first sample whose score (already in its training dtype) is
    NaN, infinite or beyond ±MAX_ABS_SCORE; ``source`` says what scored it (a reward model, an environment)."""
    bad = (~(torch.isfinite(scores) & (scores.abs() <= MAX_ABS_SCORE))).nonzero().flatten().tolist()
    if bad:
        first = bad[0]
        raise NonFiniteRewardError(
            f"{source} scored {scores[first].item()} on sample {first} (data_source={data_sources[first]!r}); "
            f"{len(bad)} of {len(scores)} scores in the batch are not finite in {scores.dtype} or beyond "
            f"±{MAX_ABS_SCORE:g}"
        )


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


def call_all(fn: RewardFunction, samples: list[RewardInput]) -> list[Any]:
    """Each sample's return value, or the exception the function raised on it."""
    if is_async(fn):
        return run_async(gather(fn, samples))
    results: list[Any] = []
    for sample in samples:
        try:
            results.append(call(fn, sample))
        except Exception as e:
            results.append(e)
    return results


def score_batch(
    fn: RewardFunction, samples: list[RewardInput], *, on_error: OnError = "fail", max_error_fraction: float = 0.0
) -> list[RewardOutput]:
    """Score every sample. A sample the function raised on fails the batch (``RewardFunctionError`` naming the
    first, chained to its cause), or with ``on_error="zero"`` scores 0 while at most ``max_error_fraction`` of the
    batch failed. A return value that is no score, or not finite in float32, always fails."""
    results = call_all(fn, samples)
    errors = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)]
    if errors and (on_error == "fail" or len(errors) > max_error_fraction * len(samples)):
        index, first = errors[0]
        allowed = f" (reward.onError zero allows {max_error_fraction:g} of the batch)" if on_error == "zero" else ""
        raise RewardFunctionError(
            failure(fn, index, samples[index], f"raised {type(first).__name__}: {first}")
            + f"; {len(errors)} of {len(samples)} samples raised{allowed}"
        ) from first
    outputs = []
    for index, (sample, result) in enumerate(zip(samples, results, strict=True)):
        if isinstance(result, Exception):
            log.warning("%s; scored 0 (reward.onError zero)", failure(fn, index, sample, f"raised {result!r}"))
            outputs.append(RewardOutput(score=0.0, extra={ERROR_KEY: 1.0}))
            continue
        output = to_output(fn, index, sample, result)
        outputs.append(RewardOutput(output.score, {**output.extra, ERROR_KEY: 0.0}) if on_error == "zero" else output)
    return outputs


@dataclass(frozen=True)
class RewardPolicy:
    """``spec.reward``'s handling of slow and failing functions."""

    timeout_seconds: float
    on_error: OnError = "fail"
    max_error_fraction: float = 0.0


class InProcessScorer:
    """A builtin, called in the driver: ours, pure and bounded (a regex over the response's tail), so no process."""

    def __init__(self, fn: RewardFunction, policy: RewardPolicy) -> None:
        self.fn = fn
        self.policy = policy

    def score(self, samples: list[RewardInput]) -> list[RewardOutput]:
        return score_batch(
            self.fn, samples, on_error=self.policy.on_error, max_error_fraction=self.policy.max_error_fraction
        )

    def close(self) -> None:
        pass
