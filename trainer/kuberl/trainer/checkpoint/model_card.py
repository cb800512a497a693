"""The README.md `kuberl export` writes beside the weights: a Hugging Face model card saying what trained them.

From the checkpoint (its step, epoch, RLJob) and, when the export source is a run folder, the spec the run recorded
(base model, algorithm, data, reward, batch). The YAML front matter is the hub's: library, base model, tags.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

HF_SCHEME = "hf://"


def kuberl_version() -> str:
    try:
        return version("kuberl")
    except PackageNotFoundError:
        return "unknown"


def model_card(checkpoint: Path, state: dict[str, Any], spec: dict[str, Any] | None, dtype: str) -> str:
    """The card's Markdown: front matter, what the weights are, and the settings that made them."""
    name = state.get("rljob") or "kuberl"
    spec = spec or {}
    model = spec.get("model", {})
    algorithm = spec.get("algorithm", {})
    estimator = algorithm.get("advantageEstimator", "RL")
    base = str(model.get("path", ""))
    front: dict[str, Any] = {"library_name": "transformers", "tags": ["kuberl", "reinforcement-learning", estimator]}
    if base.startswith(HF_SCHEME):
        front["base_model"] = base.removeprefix(HF_SCHEME).split("@")[0]
    total = state.get("total_steps")
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {name}, step {state.get('step')}",
        "",
        f"The policy of RLJob `{name}` after step {state.get('step')}{f' of {total}' if total else ''} (epoch "
        f"{state.get('epoch')}), trained with kuberl {kuberl_version()} and exported in {dtype} from the checkpoint "
        f"`{checkpoint}`.",
    ]
    if spec:
        kl = algorithm.get("kl", {})
        data = spec.get("data", {})
        batch = spec.get("batch", {})
        rows = [
            ("base model", f"`{base}`" + (" (LoRA merged)" if model.get("lora") else "")),
            ("advantage estimator", estimator),
            ("policy loss", algorithm.get("policyLoss", {}).get("lossMode", "vanilla")),
            ("KL", _kl(kl)),
            ("reward", f"`{spec.get('reward', {}).get('function', 'default')}`"),
            ("training data", ", ".join(f"`{f}`" for f in data.get("trainFiles", []))),
            (
                "batch",
                f"{batch.get('trainBatchSize')} prompts × {batch.get('rolloutN')} responses per step, mini-batches of "
                f"{batch.get('ppoMiniBatchSize')} prompts",
            ),
            ("lengths", f"prompt ≤ {data.get('maxPromptLength')}, response ≤ {data.get('maxResponseLength')} tokens"),
            ("learning rate", str(spec.get("actor", {}).get("optim", {}).get("lr"))),
        ]
        lines += ["", "| setting | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]]
    return "\n".join(lines) + "\n"


def _kl(kl: dict[str, Any]) -> str:
    parts = []
    if kl.get("loss", {}).get("enabled"):
        parts.append(f"loss {kl['loss'].get('type')} × {kl['loss'].get('coef')}")
    if kl.get("inReward"):
        parts.append(f"in the reward {kl.get('type')} × {kl.get('coef')} ({kl.get('control')})")
    return ", ".join(parts) or "none"
