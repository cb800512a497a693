"""``kuberl plot RUN_DIR``: reward, KL, response length and throughput over steps, from ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path

PANELS = (
    ("reward", ("critic/score/mean",), "val-core/"),
    ("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl"), None),
    ("response length", ("response_length/mean",), None),
    ("throughput (tokens/s per device)", ("perf/throughput",), None),
)


def plot_run(run_dir: str | Path, output: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kuberl.trainer.metrics import read_jsonl

    source = Path(run_dir) / "metrics.jsonl"
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist: pass the run folder of `kuberl run` (runs/<name>/)")
    records = read_jsonl(source)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (title, keys, prefix) in zip(axes.flat, PANELS, strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                ax.plot(*zip(*points, strict=True), label=key, marker="." if len(points) < 50 else None)
        if prefix:
            for key in sorted({k for r in records for k in r if k.startswith(prefix)}):
                points = [(r["step"], r[key]) for r in records if key in r]
                ax.plot(*zip(*points, strict=True), label=key, marker="o", linestyle="--")
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    out = Path(output) if output else Path(run_dir) / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
