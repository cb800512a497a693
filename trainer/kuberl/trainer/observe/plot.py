"""``kuberl plot RUN_DIR``: one PNG of a run's reward, KL to the reference, entropy, response length, step-time
split and throughput, from ``metrics.jsonl``, titled with the RLJob's name from ``rljob.json``.

KL is the divergence from the reference policy (``actor/kl_loss`` when it is a loss term, ``actor/reward_kl_penalty``
when it is in the reward); ``actor/ppo_kl`` (old versus new policy within a step) is not KL to the reference and is
not drawn there. Response length is drawn from zero to ``data.maxResponseLength`` with its min–max band, so the
scale is the budget, not the noise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kuberl.trainer.observe.metrics import RUN_RECORD

REWARD = "critic/score/mean"
VALIDATION_PREFIX = "val-core/"
REFERENCE_KL = {"actor/kl_loss": "KL loss term", "actor/reward_kl_penalty": "KL in the reward"}
ENTROPY = "actor/entropy"
LENGTH = ("response_length/mean", "response_length/min", "response_length/max")
STEP_TIME = "timing_s/step"
TIMING_PREFIX = "timing_s/"
THROUGHPUT = "perf/throughput"


def series(records: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in records if key in r]
    return [p[0] for p in points], [p[1] for p in points]


def read_records(source: Path) -> list[dict[str, float]]:
    """The step records of ``metrics.jsonl``; a cut-off last line (a run killed mid-write) is left out."""
    lines = source.read_text().split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{source}:{number}: not valid JSON ({exc.msg})") from exc
        if "step" in record:
            records.append(record)
    return records


def run_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_RECORD
    record: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    return record


def time_split(records: list[dict[str, float]]) -> tuple[list[float], dict[str, list[float]]]:
    """Seconds per phase for each step that logged a step time; what the phases do not cover is ``other``."""
    timed = [r for r in records if STEP_TIME in r]
    phases = sorted({k for r in timed for k in r if k.startswith(TIMING_PREFIX) and k != STEP_TIME})
    split = {p.removeprefix(TIMING_PREFIX): [r.get(p, 0.0) for r in timed] for p in phases}
    split["other"] = [max(0.0, r[STEP_TIME] - sum(r.get(p, 0.0) for p in phases)) for r in timed]
    return [r["step"] for r in timed], split


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(run_dir)
    source = folder / "metrics.jsonl"
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist: pass the run folder of `kuberl run` (runs/<name>/)")
    records = read_records(source)
    fig = figure(records, run_record(folder), folder)
    out = Path(output) if output else folder / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def figure(records: list[dict[str, float]], record: dict[str, Any], folder: Path) -> Any:
    """The six panels; ``record`` is the run's ``rljob.json`` (empty when the run wrote none)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(12, 10))
    (reward, kl), (entropy, length), (timing, throughput) = axes

    reward.plot(*series(records, REWARD), label="train score (mean)")
    for key in sorted({k for r in records for k in r if k.startswith(VALIDATION_PREFIX)}):
        reward.plot(*series(records, key), label=key.removeprefix(VALIDATION_PREFIX), marker="o", linestyle="--")
    reward.set_title("reward")

    for key, label in REFERENCE_KL.items():
        steps, values = series(records, key)
        if steps:
            kl.plot(steps, values, label=label)
    if not kl.lines:
        kl.text(0.5, 0.5, "no KL to the reference logged\n(algorithm.kl off)", ha="center", va="center")
    kl.set_title("KL to the reference policy")

    entropy.plot(*series(records, ENTROPY), label="entropy (nats/token)")
    entropy.set_title("policy entropy")

    steps, mean = series(records, LENGTH[0])
    _, low = series(records, LENGTH[1])
    _, high = series(records, LENGTH[2])
    length.plot(steps, mean, label="mean")
    if len(low) == len(steps) == len(high):
        length.fill_between(steps, low, high, alpha=0.2, label="min–max")
    budget = record.get("spec", {}).get("data", {}).get("maxResponseLength")
    length.set_ylim(0, budget or max(high or mean or [1]) * 1.05)
    length.set_title(f"response length (tokens{f', of maxResponseLength {budget}' if budget else ''})")

    timed_steps, split = time_split(records)
    if timed_steps:
        timing.stackplot(timed_steps, list(split.values()), labels=list(split), alpha=0.8)
    timing.set_title("step time split (s)")

    throughput.plot(*series(records, THROUGHPUT), label="tokens/s per device")
    throughput.set_title("throughput")

    for ax in axes.flat:
        ax.set_xlabel("step")
        if ax.lines or ax.collections:
            ax.legend(fontsize=7)
    name = record.get("name")
    fig.suptitle(f"RLJob {name}  ({folder})" if name else f"{folder} (no {RUN_RECORD}: RLJob name unknown)")
    fig.tight_layout()
    return fig
