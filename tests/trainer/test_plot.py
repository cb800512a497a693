"""What `kuberl plot` draws: KL to the reference (never ppo_kl), entropy, the length budget, the step-time split
and the RLJob's name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kuberl.trainer.observe.metrics import write_run_record
from kuberl.trainer.observe.plot import figure, run_record, time_split


def step(n: int, **values: float) -> dict[str, float]:
    return {"step": n, **values}


def panel(fig: Any, title_start: str) -> Any:
    (ax,) = [ax for ax in fig.axes if ax.get_title().startswith(title_start)]
    return ax


def labels(ax: Any) -> list[str]:
    return [line.get_label() for line in ax.lines]


@pytest.fixture(autouse=True)
def _close_figures() -> Any:
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_ppo_kl_is_not_drawn_as_kl_to_the_reference(tmp_path: Path) -> None:
    fig = figure([step(1, **{"actor/ppo_kl": 0.3}), step(2, **{"actor/ppo_kl": 0.1})], {}, tmp_path)
    kl = panel(fig, "KL to the reference")
    assert len(kl.lines) == 0 and "no KL to the reference logged" in kl.texts[0].get_text()


def test_kl_loss_and_kl_in_the_reward_are_drawn_under_their_names(tmp_path: Path) -> None:
    records = [step(s, **{"actor/kl_loss": 0.01 * s, "actor/reward_kl_penalty": 0.02 * s}) for s in (1, 2)]
    kl = panel(figure(records, {}, tmp_path), "KL to the reference")
    assert labels(kl) == ["KL loss term", "KL in the reward"]
    assert list(kl.lines[0].get_ydata()) == [0.01, 0.02]


def test_entropy_has_its_own_panel(tmp_path: Path) -> None:
    entropy = panel(figure([step(1, **{"actor/entropy": 4.5})], {}, tmp_path), "policy entropy")
    assert list(entropy.lines[0].get_ydata()) == [4.5]


def test_response_length_axis_spans_the_budget(tmp_path: Path) -> None:
    records = [
        step(s, **{"response_length/mean": 100 + s, "response_length/min": 90, "response_length/max": 120})
        for s in (1, 2)
    ]
    record = {"name": "job", "spec": {"data": {"maxResponseLength": 512}}}
    length = panel(figure(records, record, tmp_path), "response length")
    assert length.get_ylim() == (0, 512) and "maxResponseLength 512" in length.get_title()


def test_step_time_split_adds_up_to_the_step_time() -> None:
    records = [step(1, **{"timing_s/step": 3.0, "timing_s/gen": 1.0, "timing_s/update_actor": 1.5})]
    steps, split = time_split(records)
    assert steps == [1] and split == {"gen": [1.0], "update_actor": [1.5], "other": [0.5]}


def test_the_title_is_the_rljob_name_recorded_by_the_run(tmp_path: Path) -> None:
    write_run_record(tmp_path, "tiny-cpu", "default", {"trainer": {"checkpointDir": "ckpt"}})
    record = run_record(tmp_path)
    assert record["checkpointDir"] == str((Path.cwd() / "ckpt").resolve())
    fig = figure([step(1, **{"critic/score/mean": 0.1})], record, tmp_path)
    assert fig._suptitle.get_text().startswith("RLJob tiny-cpu")
