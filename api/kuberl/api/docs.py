"""Generate docs/api.md: every field with type, default and meaning, the rules table, and name mappings."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel

from kuberl.api.contract import API_VERSION
from kuberl.api.crd import field_default
from kuberl.api.policy import OPERATOR_RULES
from kuberl.api.rules import RULES, VERL_CHECKS
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import RLJobStatus
from kuberl.api.verl import BLOG_NAMES, VERL_KEYS, VerlKey


def _verl_note(key: VerlKey) -> str:
    if key.runs_as is None:
        return key.note
    values = ", ".join("null" if v is None else str(v) for v in key.runs_as)
    return f"{key.note}; any value but {values} is refused (--lossy drops it)"


# Algorithms: (name, verl's config, formula). Per response i of group g: r_i its summed reward, n_g the group's
# size, |y_i| its masked tokens; per token ρ = π/π_old. Kept in step with kuberl.trainer.algorithms.advantages / losses.
ESTIMATORS: list[tuple[str, str, str]] = [
    (
        "gae",
        "adv_estimator=gae",
        "δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1}, whitened over the batch; needs critic",
    ),
    ("grpo", "adv_estimator=grpo", "(r_i − mean_g)/(std_g + 1e-6); normAdvByStd false: r_i − mean_g (Dr.GRPO)"),
    ("rloo", "adv_estimator=rloo", "n_g/(n_g − 1)·(r_i − mean_g)"),
    ("reinforce_plus_plus", "adv_estimator=reinforce_plus_plus", "G_t = r_t + γG_{t+1}, whitened over the batch"),
    (
        "reinforce_plus_plus_baseline",
        "adv_estimator=reinforce_plus_plus_baseline",
        "r_i − mean_g on every token, whitened over the batch's tokens",
    ),
    (
        "remax",
        "adv_estimator=remax",
        "G_t − b_i, G_t = Σ_{s≥t} r_s, b_i the reward of the greedy response to the prompt",
    ),
    ("opo", "adv_estimator=opo", "r_i − Σ_g |y_j|·r_j / Σ_g |y_j| (length-weighted baseline)"),
    ("gpg", "adv_estimator=gpg", "a·(r_i − mean_g), a = B / #(r ≠ 0) over the batch of B responses"),
    (
        "grpo_passk",
        "adv_estimator=grpo_passk",
        "best response of the group: (r_max − r_second)/(std_g + 1e-6) (no std with normAdvByStd false); others 0",
    ),
]

POLICY_LOSSES: list[tuple[str, str, str]] = [
    (
        "vanilla",
        "policy_loss.loss_mode=vanilla",
        "max(−Aρ, −A·clip(ρ, 1−ε_low, 1+ε_high)); for A < 0 also min(·, −A·clipRatioC); log ρ clamped to ±20",
    ),
    (
        "gspo",
        "policy_loss.loss_mode=gspo",
        "s_i = exp(mean_t log ρ) per sequence (value of every token's ratio, gradient of its log π); "
        "max(−A·s, −A·clip(s, 1−ε_low, 1+ε_high)); always seq-mean-token-mean, as the paper and verl, whatever "
        "lossAggMode says (which still aggregates the KL and entropy terms); paper: ε ≈ 3e-4/4e-4",
    ),
    ("gpg", "policy_loss.loss_mode=gpg", "−A·log π (no ratio, no clip)"),
    (
        "clip_cov",
        "policy_loss.loss_mode=clip_cov",
        "vanilla clip without dual clip; of the unclipped tokens with clipCovLb < (A − Ā)(log π − mean log π) < "
        "clipCovUb, max(1, ⌊clipCovRatio·tokens⌋) random ones per micro-batch get weight 0",
    ),
    (
        "kl_cov",
        "policy_loss.loss_mode=kl_cov",
        "−Aρ (no clip); the max(1, ⌊klCovRatio·tokens⌋) tokens per micro-batch of largest (A − Ā)(log π − mean "
        "log π) add ppoKlCoef·|log ρ|",
    ),
    (
        "geo_mean",
        "policy_loss.loss_mode=geo_mean",
        "GMPO: −Ā_i·exp(mean_t δ'), δ' = s·min(s·log ρ, s·clip(log ρ, −ε_low, ε_high)), s = sign(A); "
        "mean over sequences whatever lossAggMode says",
    ),
    (
        "cispo",
        "policy_loss.loss_mode=cispo",
        "−sg[clip(ρ, 1−ε_low, 1+ε_high)]·A·log π: every token keeps its gradient (MiniMax-M1 sets ε_low 1)",
    ),
]

AGGREGATIONS: list[tuple[str, str, str]] = [
    ("token-mean", "loss_agg_mode=token-mean", "Σ_i Σ_t L / (masked tokens of the mini-batch)"),
    ("seq-mean-token-sum", "loss_agg_mode=seq-mean-token-sum", "Σ_i Σ_t L / (sequences of the mini-batch)"),
    (
        "seq-mean-token-mean",
        "loss_agg_mode=seq-mean-token-mean",
        "Σ_i (Σ_t L / |y_i|) / (sequences of the mini-batch)",
    ),
    (
        "seq-mean-token-sum-norm",
        "loss_agg_mode=seq-mean-token-sum-norm",
        "Σ_i Σ_t L / data.maxResponseLength (verl's loss_scale_factor default, the response length): no division "
        "by the sequence count, so the loss grows with the mini-batch (Dr.GRPO)",
    ),
]


def _algorithm_rows(rows: list[tuple[str, str, str]]) -> list[str]:
    return [f"| `{name}` | `{verl}` | {_cell(formula)} |" for name, verl, formula in rows]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args if a is not type(None))
    if origin is Literal:
        return " \\| ".join(str(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The model inside `X`, `X | None` or `list[X]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        inner = _nested(arg)
        if inner:
            return inner
    return None


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        nested = _nested(field.annotation)
        if field.is_required():
            default = "required"
        else:
            value = field_default(field)
            default = "—" if value is None or nested else f"`{json.dumps(value, ensure_ascii=False)}`"
        description = _cell(field.description or "")
        rows.append(f"| `{path}` | {_type_name(field.annotation)} | {default} | {description} |")
        if nested and nested.model_fields:
            is_list = typing.get_origin(field.annotation) is list
            rows += _rows(nested, path + ("[]." if is_list else "."))
    return rows


def api_markdown() -> str:
    rule_rows = [f"| `{r.id}` | `{r.path}` | {r.verl} | `{_cell(r.rule)}` | {_cell(r.static_message)} |" for r in RULES]
    return "\n".join(
        [
            "<!-- Generated by `kuberl docs` from kuberl.api (spec models + rules table). Do not edit. -->",
            f"# RLJob API reference (`{API_VERSION}`)",
            "",
            "An RLJob declares one RL post-training run. Batch semantics are verl's: `trainBatchSize` prompts per "
            "step (global), `rolloutN` responses per prompt, `ppoMiniBatchSize` prompts per optimizer step (global), "
            "micro-batches per GPU counted in responses. Gradient accumulation is derived, never configured: "
            "`kuberl validate FILE` prints it with the other derived quantities.",
            "",
            "## Spec",
            "",
            "| field | type | default | meaning |",
            "|---|---|---|---|",
            *_rows(RLJobSpec, "spec."),
            "",
            "## Admission rules",
            "",
            "Checked by the apiserver (CEL `x-kubernetes-validations` in `crds/rljob.yaml`) and, with the same "
            "expressions and messages, by `kuberl validate`, the operator and the trainer. In rules, `DP` is "
            "`cluster.trainer.nodes × gpusPerNode`, `RESPONSES` is `trainBatchSize × rolloutN`, `MINI_RESPONSES` is "
            "`ppoMiniBatchSize × rolloutN`, `ROLLOUT_GPUS` the GPUs of the rollout pool (the trainer's when colocated). "
            "The verl column names the check of verl's it mirrors (listed below the table); where verl floors "
            "silently (R6) or only fails at run time, kuberl refuses at admission.",
            "",
            "| id | field | verl | rule | message |",
            "|---|---|---|---|---|",
            *rule_rows,
            "",
            "### The operator's checks",
            "",
            "What the CRD cannot check: the chart's trust policy (docs/security.md), free-form Kubernetes "
            "objects and the memory plan (`plan-fits`: the message is the plan `kuberl plan` prints). The operator "
            "refuses such a job (phase `Failed`, `Valid=False`, naming the field) before it "
            "creates anything, and `kuberl validate` makes the same checks: with the chart's defaults, with a values "
            "file (`--policy VALUES`), or with the installed operator's settings (`--cluster`). `kuberl run` (one "
            "machine, no pods) skips them; its trainer plans with the model's own config.",
            "",
            "| id | what it refuses |",
            "|---|---|",
            *(f"| `{rule}` | {_cell(meaning)} |" for rule, meaning in OPERATOR_RULES.items()),
            "",
            "| verl | what verl checks, and where |",
            "|---|---|",
            *(f"| {key} | {_cell(check)} |" for key, check in VERL_CHECKS.items()),
            "",
            "## Algorithms",
            "",
            "Every estimator, policy loss and aggregation is one registered function (`kuberl.trainer.algorithms.advantages`, "
            "`kuberl.trainer.algorithms.losses`) with verl's definition. Per response i of group g (the rolloutN responses to "
            "one prompt): r_i its summed reward, |y_i| its response tokens, ρ = π/π_old per token, "
            "ε_low/ε_high = algorithm.clipRatioLow/High. All aggregations are over the global mini-batch, so the "
            "loss does not depend on micro-batching or the GPU count.",
            "",
            "### Advantage estimators (`algorithm.advantageEstimator`)",
            "",
            "| name | verl | advantage |",
            "|---|---|---|",
            *_algorithm_rows(ESTIMATORS),
            "",
            "### Policy losses (`algorithm.policyLoss.lossMode`)",
            "",
            "| name | verl | per-token loss L |",
            "|---|---|---|",
            *_algorithm_rows(POLICY_LOSSES),
            "",
            "### Loss aggregation (`algorithm.lossAggMode`)",
            "",
            "| name | verl | loss |",
            "|---|---|---|",
            *_algorithm_rows(AGGREGATIONS),
            "",
            "### DAPO",
            "",
            "DAPO (arXiv 2503.14476) is four settings: clip-higher (`clipRatioLow: 0.2`, `clipRatioHigh: 0.28`), "
            "token-level loss (`lossAggMode: token-mean`), dynamic sampling (`algorithm.filterGroups`: groups whose "
            "metric is equal for every response are dropped and generation repeats, at most `maxNumGenBatches` "
            "rounds, until `trainBatchSize` prompts remain) and overlong shaping (`reward.overlongBuffer`: "
            "−penaltyFactor·(|y| − (maxResponseLength − length))/length once a response passes "
            "maxResponseLength − length tokens). `examples/dapo-tiny-cpu.yaml` shows a job. Each generation round "
            "draws the next `trainBatchSize` prompts from the data (verl's `gen_batch_size` equal to "
            "`train_batch_size`), so the data position in a checkpoint counts every round; the step trains on "
            "exactly `trainBatchSize × rolloutN` responses, the first kept groups in generation order, and logs "
            "`dynamic_sampling/kept_groups`, `dropped_groups`, `rounds` and `generated_score/mean` (the mean score "
            "over every generated response, which the filter does not bias). The overlong penalty is part of each "
            "score (`critic/score/*`) and is logged as `reward_extra/overlong_penalty/mean`. `seq_final_reward` "
            "with `kl.inReward` computes each round's log-probs for the filter. For `remax` each round also "
            "generates one greedy response per prompt through the same rollout and scores it (the baseline).",
            "",
            "## Status",
            "",
            "| field | type | default | meaning |",
            "|---|---|---|---|",
            *_rows(RLJobStatus, "status."),
            "",
            "## From verl's keys",
            "",
            "`kuberl import-verl` reads a verl run (a launch script expanded as bash would, a verl YAML, or "
            "`key=value` overrides, composed with verl's own config files when they are installed) through this "
            "table and writes an RLJob; keys without an RLJob field are listed with the reason shown here, never "
            "dropped silently, and a key whose value kuberl cannot run as verl does is refused unless `--lossy` "
            "(docs/migrating-from-verl.md). `kuberl validate` points a verl name written into an RLJob "
            "(`rollout.n`) at its field.",
            "",
            "| verl | RLJob | note |",
            "|---|---|---|",
            *[f"| `{k.verl}` | {f'`{k.rljob}`' if k.rljob else '—'} | {_cell(_verl_note(k))} |" for k in VERL_KEYS],
            "",
            "## From names used in popular blog posts",
            "",
            "These names are not verl keys; several mislead.",
            "",
            "| name | RLJob | where it misleads |",
            "|---|---|---|",
            *[f"| `{a}` | {b} | {c} |" for a, b, c in BLOG_NAMES],
            "",
        ]
    )
