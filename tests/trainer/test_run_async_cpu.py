"""``rollout.overlap: async`` on CPU with real parts: a trainer rank and two separate ``hf`` engines in Ray actors of
their own, generating continuously into the bounded queue while the trainer updates, weights through the Ray object
store.

What is checked is read from the experience each step trained (every row's weight version, as the engine that
generated it stamped it, and its prompt) and from the metrics: no row more than ``rollout.maxStaleness`` versions
behind the policy that trains on it, every step trained once, no prompt trained twice, across a stop and a resume
in the middle of the run too.
"""

import os
import signal
from pathlib import Path

import pytest

from kuberl.api import parse_spec
from kuberl.trainer.observe.metrics import read_jsonl
from tests.trainer.test_run_overlap_cpu import spec as overlap_spec

STEPS = 6
BATCH = 4


def spec(checkpoint_dir: Path, *, staleness: int, response_length: int = 4, partial: bool = False) -> dict:
    """The one-step-off test's job (its tiny policy, data and reward), generating asynchronously on two engines."""
    doc = overlap_spec(checkpoint_dir, "async")
    doc["data"]["maxResponseLength"] = response_length
    doc["rollout"].update(maxStaleness=staleness, partialRollouts=partial)
    doc["trainer"]["totalSteps"] = STEPS
    doc["cluster"]["rollout"]["gpusPerNode"] = 2
    return doc


class Recorder:
    """What each step trained: its rows' staleness (the step's policy version less each row's weight version) and
    the prompts (their row index in the data)."""

    def __init__(self) -> None:
        self.staleness: dict[int, list[int]] = {}
        self.prompts: dict[int, list[int]] = {}

    def wrap(self, trainer):
        update = trainer.update

        def recorded(exp, timer):
            step = trainer.global_step + 1
            assert step not in self.staleness, f"step {step} trained twice"
            self.staleness[step] = (trainer.global_step - exp.weight_version).tolist()
            self.prompts[step] = sorted({s.index for s in exp.samples})
            return update(exp, timer)

        trainer.update = recorded


def train(doc: dict, run_dir: Path, recorder: Recorder, *, stop_after: int | None = None) -> int:
    """One attempt of the run through the driver's own loop; ``stop_after``: a real SIGINT during that step."""
    from kuberl.trainer.driver.trainer import Trainer

    trainer = Trainer("async", parse_spec(doc), run_dir=run_dir, show_progress=False)
    try:
        trainer.setup()
        recorder.wrap(trainer)
        if stop_after is not None:
            update = trainer.update

            def interrupt(exp, timer):
                if trainer.global_step + 1 == stop_after:
                    os.kill(os.getpid(), signal.SIGINT)
                return update(exp, timer)

            trainer.update = interrupt
        return trainer.fit()
    finally:
        trainer.shutdown()


@pytest.mark.timeout(600)
def test_a_stop_in_the_middle_of_async_training_resumes_without_training_a_step_or_a_prompt_twice(tmp_path, local_ray):
    from kuberl.api.contract import EXIT_INTERRUPTED
    from kuberl.trainer.checkpoint import files

    doc = spec(tmp_path / "ckpt", staleness=2)
    recorder = Recorder()
    assert train(doc, tmp_path / "run", recorder, stop_after=3) == EXIT_INTERRUPTED
    assert sorted(recorder.staleness) == [1, 2, 3]
    state = files.read_state(files.find_latest(tmp_path / "ckpt"))
    assert state["step"] == 3
    # groups generated ahead of step 4 (as many as the engines reached) finish out of the loader's order: the
    # checkpoint keeps the oldest untrained prompt's batch and which prompts after it are trained already
    position = state["dataloader"]
    assert position["epoch"] * 128 + position["batch_in_epoch"] <= 3
    assert len(position["trained_ahead"]) == 3 * BATCH - position["batch_in_epoch"] * BATCH

    assert train(doc, tmp_path / "run", recorder) == 0
    steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert sorted(recorder.staleness) == list(range(1, STEPS + 1))
    for step, staleness in recorder.staleness.items():
        assert len(staleness) == BATCH * 2
        assert all(0 <= s <= 2 for s in staleness), (step, staleness)
    prompts = [p for step in sorted(recorder.prompts) for p in recorder.prompts[step]]
    assert len(prompts) == len(set(prompts)) == STEPS * BATCH  # no prompt twice within the epoch
    # the resumed run's engines start from the checkpoint's weights: step 4 trains nothing older than them
    assert max(recorder.staleness[4]) == 0
    # the engines ran ahead of the trainer: the queue held groups of older weights, up to the bound and not past it
    assert max(r["rollout/staleness/max"] for r in steps) == 2
    for r in steps:  # each step's metrics agree with what it trained
        assert r["rollout/staleness/max"] == r["rollout/staleness"] == max(recorder.staleness[r["step"]])
        assert r["rollout/staleness/min"] == min(recorder.staleness[r["step"]])
        assert r["rollout/staleness/min"] <= r["rollout/staleness/mean"] <= r["rollout/staleness/max"]
        assert r["rollout/engines"] == 2 and r["rollout/queue_depth"] <= 3 * BATCH  # (k + 1) batches at most
        assert r["timing_s/gen_wait"] >= 0 and 0 <= r["rollout/engine_idle_fraction"] <= 1
        assert r["rollout/lost_groups"] == 0  # no engine was lost: nothing generated twice for that
    # off-policy rows are weighed by the rollout correction: the engines' log-probs differ from the trainer's
    stale_steps = [r for r in steps if r["rollout/staleness/max"] > 0]
    assert stale_steps and all(r["mismatch/rollout_is_max"] > 1.0 + 1e-3 for r in stale_steps)


@pytest.mark.timeout(600)
def test_partial_rollouts_continue_the_responses_a_weight_update_stopped(tmp_path, local_ray):
    """Responses up to 192 tokens of the random tiny policy (it rarely samples eos) make the engines the slower side,
    so every weight update finds generations in flight: they stop, and what they sampled is continued with the new
    weights. Every step is still trained once, no prompt twice, no row older than k."""
    doc = spec(tmp_path / "ckpt", staleness=1, response_length=192, partial=True)
    recorder = Recorder()
    assert train(doc, tmp_path / "run", recorder) == 0
    steps = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert sorted(recorder.staleness) == list(range(1, STEPS + 1))
    assert all(0 <= s <= 1 for staleness in recorder.staleness.values() for s in staleness)
    prompts = [p for step in sorted(recorder.prompts) for p in recorder.prompts[step]]
    assert len(prompts) == len(set(prompts)) == STEPS * BATCH
    interrupted = [r["rollout/interrupted_samples"] for r in steps]
    assert sum(interrupted) > 0, interrupted
    assert all(0 <= n <= BATCH * 2 for n in interrupted)
