"""The ``code_tests`` rewards: the response's program run against the row's tests in the job's sandbox pool.

As verl's code rewards (PRIME, sandbox fusion) do: the program is the response's last ```python block, the tests are
the row's ``reward_model.ground_truth`` in verl's code-dataset schema (:mod:`kuberl.sandbox.grading`), each test
is a fresh run of the program in the sandbox, and the expected outputs never enter it. ``code_tests`` scores the
share of tests passed, ``code_tests_all_pass`` 1 only when every test passed. A batch's programs run together, as
many at once as the pool runs (``reward.sandbox``: replicas × executionsPerPod), within ``reward.timeoutSeconds``.

Per-test results come back as reward extras (``reward_extra/<key>/mean``): ``test_<verdict>``, the share of the
row's tests with each verdict (:data:`VERDICTS`: passed, a wrong answer, or how the run failed), ``all_passed`` and
``code_block`` (whether the response had a program at all).
"""

from __future__ import annotations

import logging
import re

from kuberl.api.contract import SANDBOX_REWARD
from kuberl.sandbox.client import execute_all, job_sandbox
from kuberl.sandbox.grading import Case, cases_from_ground_truth, passed
from kuberl.sandbox.protocol import Execution, Outcome, RunResult
from kuberl.trainer.rewards.functions import RewardFunctionError, RewardInput, RewardOutput, RewardTimeoutError
from kuberl.trainer.rewards.scoring import RewardPolicy

CODE_TESTS_BUILTINS = {"code_tests": False, "code_tests_all_pass": True}
"""The builtins by name (those of kuberl.api.spec.SANDBOXED_REWARDS, which admission asks a pool for), and whether
one scores all-pass instead of the pass rate."""

CODE_BLOCK = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)(```|\Z)", re.DOTALL | re.IGNORECASE)
"""A block fenced as python (python3, py), closed or running to the end of the response."""
WRONG_ANSWER = "wrong_answer"
VERDICTS = ("passed", WRONG_ANSWER, *(outcome.value for outcome in Outcome if outcome is not Outcome.OK))
"""What became of one test: passed, ran but answered wrong, or the run's outcome (an error, a limit, ...)."""

log = logging.getLogger(__name__)


def program_of(response: str) -> str | None:
    """The response's last closed, non-empty Python block; without one a block still open at its end (the response
    was cut at data.maxResponseLength); None without either."""
    closed, open_at_end = None, None
    for block in CODE_BLOCK.finditer(response):
        if not block.group(1).strip():
            continue
        if block.group(2):
            closed = block.group(1)
        else:
            open_at_end = block.group(1)
    return closed if closed is not None else open_at_end


def verdict(case: Case, result: RunResult) -> str:
    if passed(case, result):
        return "passed"
    return WRONG_ANSWER if result.outcome is Outcome.OK else result.outcome.value


def scored(verdicts: list[str] | None, *, all_pass: bool) -> RewardOutput:
    """The score and extras of one response from its tests' verdicts (None: it had no program)."""
    shares = {f"test_{v}": (verdicts.count(v) / len(verdicts) if verdicts else 0.0) for v in VERDICTS}
    every = float(bool(verdicts) and shares["test_passed"] == 1.0)
    extra = {**shares, "all_passed": every, "code_block": float(verdicts is not None)}
    return RewardOutput(score=every if all_pass else shares["test_passed"], extra=extra)


class CodeTestsScorer:
    """``code_tests`` / ``code_tests_all_pass`` in the driver; the programs run in the pool announced for
    ``reward.sandbox`` (:mod:`kuberl.trainer.sandboxes`)."""

    def __init__(self, name: str, policy: RewardPolicy) -> None:
        self.name = name
        self.all_pass = CODE_TESTS_BUILTINS[name]
        self.policy = policy
        self.sandbox = job_sandbox(SANDBOX_REWARD, request_seconds=policy.timeout_seconds)

    def score(self, samples: list[RewardInput]) -> list[RewardOutput]:
        suites = [self.tests(index, sample) for index, sample in enumerate(samples)]
        programs = {i: program for i, s in enumerate(samples) if (program := program_of(s.solution_str)) is not None}
        executions = [Execution(program, tuple(case.run for case in suites[i])) for i, program in programs.items()]
        try:
            results = execute_all(self.sandbox, executions, timeout=self.policy.timeout_seconds)
        except TimeoutError as exc:
            raise RewardTimeoutError(
                f"reward function {self.name!r} did not score a batch of {len(samples)} samples within "
                f"{self.policy.timeout_seconds:g} s (reward.timeoutSeconds): {exc}. Give the pool more pods "
                "(reward.sandbox.replicas, executionsPerPod) or raise reward.timeoutSeconds"
            ) from None
        if failed := [result.error for result in results if result.error is not None]:
            log.warning(
                "%s: the sandbox could not run %d of %d programs: %s", self.name, len(failed), len(results), failed[0]
            )
        ran = dict(zip(programs, results, strict=True))
        return [
            scored(
                [verdict(case, run) for case, run in zip(suites[i], ran[i].runs, strict=True)] if i in ran else None,
                all_pass=self.all_pass,
            )
            for i in range(len(samples))
        ]

    def tests(self, index: int, sample: RewardInput) -> list[Case]:
        """The sample's tests; a ground truth that holds none fails the job whatever reward.onError says: the row
        is wrong, not the response, and would fail the same way on every step."""
        try:
            return cases_from_ground_truth(sample.ground_truth)
        except ValueError as exc:
            raise RewardFunctionError(
                f"reward function {self.name!r}: sample {index} (data_source={sample.data_source!r}) has no tests: "
                f"{exc}. Its reward_model.ground_truth must be verl's code tests as JSON, e.g. "
                '{"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]} or {"inputs": ["1 2\\n"], "outputs": ["3\\n"]}'
            ) from None

    def close(self) -> None:
        pass
