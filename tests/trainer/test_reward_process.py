"""User reward functions run in a process of their own: a batch past reward.timeoutSeconds kills it wherever the
function is stuck, and its errors, non-finite scores and crashes come back as the driver's errors."""

import time
from pathlib import Path

import pytest

from kuberl.trainer.rewards.functions import (
    ERROR_KEY,
    NonFiniteRewardError,
    RewardFunctionError,
    RewardFunctionLoadError,
    RewardInput,
    RewardOutput,
    RewardTimeoutError,
)
from kuberl.trainer.rewards.process import OUTPUT_BYTES_PER_BATCH, RewardProcess, make_scorer
from kuberl.trainer.rewards.scoring import InProcessScorer, RewardPolicy

FUNCTIONS = r"""
import os
import re
import time

def by_answer(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "raise":
        raise ValueError("cannot parse")
    if solution_str == "big":
        return 1e39
    if solution_str == "huge":
        return 3e38  # finite in float32, but its group's variance is not
    return {"score": float(solution_str == ground_truth), "length": len(solution_str)}

def sleeps_forever(data_source, solution_str, ground_truth, extra_info):
    time.sleep(1e9)

def spins_in_python(data_source, solution_str, ground_truth, extra_info):
    while True:
        pass

def stuck_in_c(data_source, solution_str, ground_truth, extra_info):
    # catastrophic backtracking: the regex engine holds the GIL for years
    return float(re.match(r"(a+)+$", "a" * 64 + "b") is not None)

def crashes(data_source, solution_str, ground_truth, extra_info):
    os._exit(3)

def record(pid, extra_info):
    with open(extra_info["pids"], "a") as f:
        f.write(f"{pid}\n")

def forks_and_floods(data_source, solution_str, ground_truth, extra_info):
    for _ in range(3):  # helpers that never end, as a pool or sandbox left behind would
        pid = os.fork()
        if pid == 0:
            os.write(1, b"a child's flood\n" * 4000)
            time.sleep(1e9)
        record(pid, extra_info)
    for _ in range(20000):  # 2 MB of its own
        print("x" * 100)
    return 1.0

def forks_then_crashes(data_source, solution_str, ground_truth, extra_info):
    pid = os.fork()
    if pid == 0:  # inherits the pipe to the driver and keeps it open
        time.sleep(1e9)
    record(pid, extra_info)
    os._exit(7)
"""
TIMEOUT = 2.0
MARGIN = 3.0
"""Seconds past the timeout that killing the process and raising may take on a loaded 2-core machine."""


@pytest.fixture(scope="module")
def functions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "user_rewards.py"
    path.write_text(FUNCTIONS)
    return path


def sample(solution: str, ground_truth: str = "3") -> RewardInput:
    return RewardInput("my/source", solution, ground_truth, {})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["sleeps_forever", "spins_in_python", "stuck_in_c"])
def test_a_hung_function_is_killed_at_the_timeout(functions: Path, name: str) -> None:
    scorer = RewardProcess(f"{functions}:{name}", RewardPolicy(timeout_seconds=TIMEOUT))
    started = time.monotonic()
    with pytest.raises(RewardTimeoutError, match=r"did not score a batch of 2 samples within 2 s") as error:
        scorer.score([sample("1"), sample("2")])
    elapsed = time.monotonic() - started
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN, elapsed
    assert isinstance(error.value, RewardFunctionError)  # the operator's permanent class
    assert scorer.process.exitcode == -9
    with pytest.raises(RewardFunctionError, match="its process is gone"):
        scorer.score([sample("1")])


@pytest.mark.timeout(120)
def test_scores_errors_and_non_finite_scores_come_back_from_the_process(functions: Path) -> None:
    scorer = RewardProcess(f"{functions}:by_answer", RewardPolicy(TIMEOUT, "zero", max_error_fraction=0.5))
    try:
        outputs = scorer.score([sample("3"), sample("raise"), sample("4")])
        assert outputs == [
            RewardOutput(1.0, {"length": 1.0, ERROR_KEY: 0.0}),
            RewardOutput(0.0, {ERROR_KEY: 1.0}),
            RewardOutput(0.0, {"length": 1.0, ERROR_KEY: 0.0}),
        ]
        with pytest.raises(RewardFunctionError, match=r"raised ValueError: cannot parse on sample 0.*2 of 2 samples"):
            scorer.score([sample("raise"), sample("raise")])
        with pytest.raises(NonFiniteRewardError, match=r"returned 1e\+39, which is inf in torch\.float32 on sample 1"):
            scorer.score([sample("3"), sample("big")])
        with pytest.raises(NonFiniteRewardError, match=r"returned 3e\+38.*within ±1e\+06"):
            scorer.score([sample("huge")])
        assert scorer.score([sample("3")])[0].score == 1.0  # the process survives errors it reports
    finally:
        scorer.close()
    assert scorer.process.exitcode is not None


@pytest.mark.timeout(120)
def test_a_crashing_process_is_an_error_with_its_exit_code(functions: Path) -> None:
    scorer = RewardProcess(f"{functions}:crashes", RewardPolicy(TIMEOUT))
    with pytest.raises(RewardFunctionError, match="its process exited with code 3"):
        scorer.score([sample("1")])


@pytest.mark.timeout(120)
def test_a_name_that_does_not_load_is_a_load_error(functions: Path) -> None:
    with pytest.raises(RewardFunctionLoadError, match=r"has no attribute 'missing'; callables there: \['by_answer'"):
        RewardProcess(f"{functions}:missing", RewardPolicy(TIMEOUT))


def test_builtins_run_in_the_driver_and_user_functions_in_a_process(functions: Path) -> None:
    assert isinstance(make_scorer("gsm8k", RewardPolicy(TIMEOUT)), InProcessScorer)
    scorer = make_scorer(f"{functions}:by_answer", RewardPolicy(TIMEOUT))
    try:
        assert isinstance(scorer, RewardProcess) and scorer.process.is_alive()
    finally:
        scorer.close()


def alive(pid: int) -> bool:
    """A process that runs (a zombie waiting for its parent to reap it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def recorded(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()]


def running(pids: list[int], within: float = 5.0) -> list[int]:
    """The processes of ``pids`` still running after ``within`` seconds (a SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + within
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.timeout(120)
def test_what_a_function_starts_dies_with_it_and_its_flood_is_cut_with_a_note(
    functions: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pids = tmp_path / "pids"
    scorer = RewardProcess(f"{functions}:forks_and_floods", RewardPolicy(timeout_seconds=60))
    try:
        outputs = scorer.score([RewardInput("my/source", "1", "1", {"pids": str(pids)})])
        assert [o.score for o in outputs] == [1.0]
    finally:
        scorer.close()
    children = recorded(pids)
    assert len(children) == 3 and running(children) == []
    shown = capfd.readouterr().err
    assert len(shown.encode()) < OUTPUT_BYTES_PER_BATCH + 1024, len(shown)  # of > 2 MB printed
    assert "the reward function's output was cut" in shown


@pytest.mark.timeout(120)
def test_a_crash_is_reported_at_once_though_a_child_holds_the_pipe(functions: Path, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    scorer = RewardProcess(f"{functions}:forks_then_crashes", RewardPolicy(timeout_seconds=60))
    started = time.monotonic()
    with pytest.raises(RewardFunctionError, match="its process exited with code 7"):
        scorer.score([RewardInput("my/source", "1", "1", {"pids": str(pids)})])
    assert time.monotonic() - started < 15  # not the 60 s timeout, reported as a hang
    assert running(recorded(pids)) == []
