"""Reward functions: builtin rules registered by name, user functions with verl's signature, a reward model.

A reward function is called as ``fn(data_source, solution_str, ground_truth, extra_info)`` (verl's
``compute_score`` signature, so verl users' functions drop in) and returns a number, a bool, or a dict with
``"score"`` plus other keys to log. It may be ``async def``; a batch of async calls runs concurrently.

Builtins run in the driver. A user's function runs in a process of its own (:class:`RewardProcess`), so that a batch
past ``reward.timeoutSeconds`` can be killed wherever it is stuck: a Python loop, a sleep, C code holding the GIL.
That process leads a process group of its own, so that what the function starts goes with it: at the timeout, on a
crash and at shutdown the whole group is killed; and its output (its children's too) reaches the driver's log
through a pipe that passes at most :data:`OUTPUT_BYTES_PER_BATCH` per batch, then one note of what it dropped.
Every score must be finite in float32, the dtype the scores are trained in (``1e39`` is finite in float64 only), and
within ±:data:`MAX_ABS_SCORE`.
"""

import asyncio
import concurrent.futures
import importlib
import importlib.util
import inspect
import logging
import math
import multiprocessing
import numbers
import os
import re
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import torch

log = logging.getLogger(__name__)
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
OUTPUT_BYTES_PER_BATCH = 65536
"""What a user's reward function (and what it starts) may print per batch into the driver's log."""
CRASH_POLL_SECONDS = 0.5
"""How often the driver looks whether the reward process still lives while it waits for a batch."""
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


RAISED_IN_PROCESS: dict[str, type[RewardFunctionError]] = {
    cls.__name__: cls for cls in (RewardFunctionError, NonFiniteRewardError)
}


class OutputLimit:
    """This process's stdout and stderr, and its children's (they inherit the descriptors), through a pipe whose
    reader passes at most OUTPUT_BYTES_PER_BATCH per batch to the driver's stderr and counts the rest; each batch
    ends with one note of what it dropped. A function printing in a loop cannot flood the job's log."""

    def __init__(self) -> None:
        self.sink = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self.read = read
        self.lock = threading.Lock()
        self.budget = OUTPUT_BYTES_PER_BATCH
        self.dropped = 0
        threading.Thread(target=self.pump, name="kuberl-reward-output", daemon=True).start()

    def pump(self) -> None:
        while chunk := os.read(self.read, 65536):
            with self.lock:
                shown = chunk[: self.budget]
                self.budget -= len(shown)
                self.dropped += len(chunk) - len(shown)
            if shown:
                os.write(self.sink, shown)

    def end_batch(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        with self.lock:
            dropped, self.dropped, self.budget = self.dropped, 0, OUTPUT_BYTES_PER_BATCH
        if dropped:
            note = (
                f"[kuberl] the reward function's output was cut: {dropped} more bytes in this batch were not shown "
                f"(at most {OUTPUT_BYTES_PER_BATCH} per batch)\n"
            )
            os.write(self.sink, note.encode())


def serve(name: str, policy: RewardPolicy, conn: Connection) -> None:
    """The reward process: lead a process group of its own, limit its output, load ``name``, then score each batch
    received until the driver closes the pipe. Replies ``("ok", outputs)`` or ``("error", class name, message)``."""
    os.setsid()  # the group the driver kills: this process and whatever the function starts
    output = OutputLimit()
    try:
        fn = load_reward_function(name)
    except Exception as e:
        conn.send(("error", type(e).__name__, str(e)))
        return
    conn.send(("ok", describe(fn)))
    while True:
        try:
            samples = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[Any, ...] = ("ok", InProcessScorer(fn, policy).score(samples))
        except Exception as e:
            reply = ("error", type(e).__name__, str(e))
        output.end_batch()
        conn.send(reply)


def kill_group(process: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL the reward process's group: the process and everything the function started that stayed in it."""
    if process.pid is None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # gone already (or not yet a group leader: kill it alone)
        if process.is_alive():
            process.kill()


class RewardProcess:
    """A user's reward function in a spawned process; a batch not scored within the timeout kills it.

    The process is not a daemon, so the function may start processes of its own (a pool, a sandbox); its process
    group, those included, is killed by :meth:`close`, when this object is collected, at a timeout and when the
    process dies (a crash is reported at once, even when a child still holds the pipe open).
    """

    def __init__(self, name: str, policy: RewardPolicy) -> None:
        self.name = name
        self.policy = policy
        context = multiprocessing.get_context("spawn")  # no fork of a driver that runs Ray's threads
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(name, policy, child), name="kuberl-reward", daemon=False)
        self.process.start()
        child.close()
        self.finalizer = weakref.finalize(self, kill_group, self.process)
        status, *reply = self.receive("load", max(LOAD_SECONDS, policy.timeout_seconds))
        if status == "error":
            self.close()
            raise RewardFunctionLoadError(reply[-1])
        self.description: str = reply[0]

    def receive(self, doing: str, timeout: float) -> tuple[Any, ...]:
        """The process's reply; a crash is reported within CRASH_POLL_SECONDS of the process's exit (its exit status,
        not the pipe's end or the process sentinel: a child it forked may hold both open)."""
        deadline = time.monotonic() + timeout
        while not self.conn.poll(min(CRASH_POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
            if not self.process.is_alive():
                self.crashed(doing)
            if time.monotonic() >= deadline:
                self.close()
                raise RewardTimeoutError(
                    f"reward function {self.name!r} did not {doing} within {timeout:g} s (reward.timeoutSeconds = "
                    f"{self.policy.timeout_seconds:g}); its process was killed: a hung function, a deadlock or a "
                    "call stuck in C. Raise reward.timeoutSeconds if the function is only slow"
                )
        try:
            reply: tuple[Any, ...] = self.conn.recv()
        except EOFError:
            self.crashed(doing)
        return reply

    def crashed(self, doing: str) -> NoReturn:
        self.process.join(timeout=5)
        code = self.process.exitcode
        self.close()
        raise RewardFunctionError(
            f"reward function {self.name!r}: its process exited with code {code} while trying to {doing} "
            "(a crash in native code, os._exit, or the OOM killer); what it started was killed with it"
        )

    def score(self, samples: list[RewardInput]) -> list[RewardOutput]:
        if not self.process.is_alive():
            raise RewardFunctionError(f"reward function {self.name!r}: its process is gone (killed earlier)")
        self.conn.send(samples)
        status, *reply = self.receive(f"score a batch of {len(samples)} samples", self.policy.timeout_seconds)
        if status == "error":
            kind, message = reply
            raise RAISED_IN_PROCESS.get(kind, RewardFunctionError)(message)
        outputs: list[RewardOutput] = reply[0]
        return outputs

    def close(self) -> None:
        self.conn.close()
        self.finalizer()
        self.process.join(timeout=5)


RewardScorer = InProcessScorer | RewardProcess


def make_scorer(name: str, policy: RewardPolicy) -> RewardScorer:
    """Builtins in the driver, anything else in a :class:`RewardProcess`."""
    if name in BUILTINS:
        return InProcessScorer(BUILTINS[name], policy)
    return RewardProcess(name, policy)


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
        from kuberl.trainer.models import load_sequence_classifier, load_tokenizer

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
