"""Writes the chart's Grafana dashboards (gpu.json, training.json, operator.json) beside this file.

    python charts/kuberl/dashboards/generate.py          # rewrite the JSON
    python charts/kuberl/dashboards/generate.py --check  # exit 1 when the JSON is stale (tests/chart runs this)

The dashboards are plain Grafana JSON (schemaVersion 39) with a Prometheus datasource variable and the
`namespace` / `rljob` variables from label_values. Series and their sources:

- GPU: NVIDIA's DCGM exporter (`DCGM_FI_*`, one series per GPU with the `pod`/`namespace` of the pod that holds it),
  falling back per RLJob to the trainer's NVML gauges (`kuberl_gpu_*{gpu="<rank>"}`) and Ray's (`ray_node_gpus_*`).
- Training: the trainer's `kuberl_*` gauges (verl's metric names, non-alphanumerics as `_`), labelled rljob/namespace.
- Operator: `kuberl_operator_*` from the operator's /metrics.

docs/observability.md describes what each panel answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
JOB = 'namespace=~"$namespace", rljob=~"$rljob"'
# the trainer's timing_s/* phases that are training work (everything of a step but generation and weight sync)
TRAINING_PHASES = "old_log_prob|ref|values|adv|update_actor|update_critic"

# ---- PromQL building blocks -------------------------------------------------------------------------------------


def dcgm(metric: str) -> str:
    """A DCGM series per GPU with the `rljob` of the pod using it.

    dcgm-exporter's Kubernetes mapping writes the GPU's pod into `pod`/`namespace`; scraped without honorLabels
    those arrive as `exported_pod`/`exported_namespace` (the exporter's own pod takes `pod`). Both shapes are
    normalised, then joined with the Ray pods' scrape targets (`up{rljob=...}`, from the chart's PodMonitor).
    """
    normalised = (
        f'label_replace(label_replace({metric}, "pod", "$1", "exported_pod", "(.+)"), '
        f'"namespace", "$1", "exported_namespace", "(.+)")'
    )
    return f"({normalised} * on (namespace, pod) group_left (rljob) group by (namespace, pod, rljob) (up{{{JOB}}}))"


def ray_gpu(metric: str) -> str:
    """A Ray per-GPU node series (label `GpuIndex`) with the GPU index as `gpu`."""
    return f'label_replace({metric}{{{JOB}}}, "gpu", "$1", "GpuIndex", "(.*)")'


def per_gpu(dcgm_expr: str, nvml_expr: str | None = None, ray_expr: str | None = None) -> str:
    """DCGM per GPU; for an RLJob without DCGM series, the trainer's NVML series; without those, Ray's."""
    by = "by (rljob, pod, gpu)"
    parts = [f"max {by} ({dcgm_expr})"]
    if nvml_expr:
        parts.append(f"max {by} ({nvml_expr})")
    if ray_expr:
        parts.append(f"max {by} ({ray_expr})")
    return "\nor on (rljob)\n".join(parts)


def per_job(agg: str, dcgm_expr: str, nvml_expr: str | None = None, ray_expr: str | None = None) -> str:
    parts = [f"{agg} by (rljob) ({dcgm_expr})"]
    if nvml_expr:
        parts.append(f"{agg} by (rljob) ({nvml_expr})")
    if ray_expr:
        parts.append(f"{agg} by (rljob) ({ray_expr})")
    return "\nor on (rljob)\n".join(parts)


def kuberl(name: str) -> str:
    return f"{name}{{{JOB}}}"


# ---- Grafana JSON building blocks -------------------------------------------------------------------------------


class Layout:
    """Places panels left to right on Grafana's 24-column grid, starting a new line when a row is full."""

    def __init__(self) -> None:
        self.x = self.y = self.row_h = 0
        self.next_id = 1
        self.panels: list[dict[str, Any]] = []

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel["id"] = self.next_id
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.next_id += 1
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self.next_id,
                "collapsed": False,
                "panels": [],
                "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
            }
        )
        self.next_id += 1
        self.y += 1


def target(expr: str, legend: str, ref: str, instant: bool = False) -> dict[str, Any]:
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": not instant}
    if instant:
        t["instant"] = True
    return t


def targets(*pairs: tuple[str, str], instant: bool = False) -> list[dict[str, Any]]:
    return [target(expr, legend, chr(ord("A") + i), instant) for i, (expr, legend) in enumerate(pairs)]


def timeseries(
    title: str,
    description: str,
    tgts: list[dict[str, Any]],
    unit: str = "short",
    *,
    stack: bool = False,
    min_: float | None = None,
    max_: float | None = None,
    decimals: int | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 40 if stack else 10,
            "showPoints": "never",
            "spanNulls": True,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(
    title: str,
    description: str,
    tgts: list[dict[str, Any]],
    unit: str = "short",
    *,
    decimals: int | None = None,
    thresholds: list[tuple[float | None, str]] | None = None,
) -> dict[str, Any]:
    steps = [{"value": v, "color": c} for v, c in (thresholds or [(None, "blue")])]
    defaults: dict[str, Any] = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    }


def bargauge(
    title: str, description: str, tgts: list[dict[str, Any]], unit: str = "short", *, max_: float | None = None
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "thresholds": {"mode": "absolute", "steps": [{"value": None, "color": "green"}]},
    }
    if max_ is not None:
        defaults["max"] = max_
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
        },
    }


def variable(name: str, label: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    v: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var", "qryType": 1},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "includeAll": multi,
        "multi": multi,
        "hide": 0,
        "current": {},
        "options": [],
        "regex": "",
    }
    if multi:
        v["allValue"] = ".+"
    return v


def dashboard(
    uid: str, title: str, description: str, layout: Layout, variables: list[dict[str, Any]], refresh: str = "30s"
) -> dict[str, Any]:
    datasource = {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["kuberl"],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "refresh": refresh,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": []},
        "links": [
            {
                "title": "kuberl dashboards",
                "type": "dashboards",
                "tags": ["kuberl"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": [datasource, *variables]},
        "panels": layout.panels,
    }


def job_variables(source: str) -> list[dict[str, Any]]:
    return [
        variable("namespace", "Namespace", f"label_values({source}, namespace)", multi=True),
        variable("rljob", "RLJob", f'label_values({source}{{namespace=~"$namespace"}}, rljob)', multi=True),
    ]


# ---- the dashboards -----------------------------------------------------------------------------------------------

# the trainer's per-GPU NVML gauges: utilization as a ratio (DCGM's is percent) and memory in bytes
GPU_UTIL_NVML = f"{kuberl('kuberl_gpu_utilization_ratio')} * 100"
GPU_MEM_NVML = kuberl("kuberl_gpu_memory_used_bytes")
GPU_UTIL_RAY = ray_gpu("ray_node_gpus_utilization")


def gpu_dashboard() -> dict[str, Any]:
    lay = Layout()
    lay.add(
        stat(
            "GPUs in use",
            "GPUs that report a series for the selected RLJobs (DCGM; else trainer NVML; else Ray).",
            targets(
                (per_job("count", dcgm("DCGM_FI_DEV_GPU_UTIL"), GPU_UTIL_NVML, GPU_UTIL_RAY), "{{rljob}}"), instant=True
            ),
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Mean GPU utilization",
            "Average over the RLJob's GPUs of the fraction of time a kernel was running.",
            targets((per_job("avg", dcgm("DCGM_FI_DEV_GPU_UTIL"), GPU_UTIL_NVML, GPU_UTIL_RAY), "{{rljob}}")),
            "percent",
            decimals=0,
            thresholds=[(None, "red"), (50, "orange"), (80, "green")],
        ),
        5,
        4,
    )
    lay.add(
        stat(
            "Mean tensor core activity",
            "Average fraction of cycles the tensor pipes were busy (DCGM profiling). "
            "Low next to high utilization: kernels run but not matmuls (rollout decode, data movement).",
            targets((f"100 * avg by (rljob) ({dcgm('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE')})", "{{rljob}}")),
            "percent",
            decimals=0,
            thresholds=[(None, "red"), (20, "orange"), (40, "green")],
        ),
        5,
        4,
    )
    lay.add(
        stat(
            "GPU memory used",
            "Framebuffer memory in use, summed over the RLJob's GPUs.",
            targets(
                (
                    per_job(
                        "sum",
                        f"{dcgm('DCGM_FI_DEV_FB_USED')} * 1048576",
                        GPU_MEM_NVML,
                        f"{ray_gpu('ray_node_gram_used')} * 1048576",
                    ),
                    "{{rljob}}",
                )
            ),
            "bytes",
        ),
        5,
        4,
    )
    lay.add(
        stat(
            "Power draw",
            "Board power summed over the RLJob's GPUs.",
            targets(
                (
                    per_job(
                        "sum",
                        dcgm("DCGM_FI_DEV_POWER_USAGE"),
                        None,
                        f"{ray_gpu('ray_node_gpu_power_milliwatts')} / 1000",
                    ),
                    "{{rljob}}",
                )
            ),
            "watt",
            decimals=0,
        ),
        5,
        4,
    )

    lay.row("Per GPU")
    lay.add(
        timeseries(
            "GPU utilization",
            "Per GPU: fraction of time one or more kernels ran (DCGM_FI_DEV_GPU_UTIL); "
            "gaps between rollout and update phases show up as dips.",
            targets(
                (per_gpu(dcgm("DCGM_FI_DEV_GPU_UTIL"), GPU_UTIL_NVML, GPU_UTIL_RAY), "{{rljob}} {{pod}} gpu {{gpu}}")
            ),
            "percent",
            min_=0,
            max_=100,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Tensor core and memory-bandwidth activity",
            "Per GPU (DCGM profiling metrics): tensor pipes busy, graphics engine busy, DRAM bandwidth busy.",
            targets(
                (
                    f"max by (rljob, pod, gpu) ({dcgm('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE')})",
                    "tensor {{rljob}} {{pod}} gpu {{gpu}}",
                ),
                (
                    f"max by (rljob, pod, gpu) ({dcgm('DCGM_FI_PROF_GR_ENGINE_ACTIVE')})",
                    "engine {{rljob}} {{pod}} gpu {{gpu}}",
                ),
                (
                    f"max by (rljob, pod, gpu) ({dcgm('DCGM_FI_PROF_DRAM_ACTIVE')})",
                    "dram {{rljob}} {{pod}} gpu {{gpu}}",
                ),
            ),
            "percentunit",
            min_=0,
            max_=1,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "GPU memory used",
            "Per GPU framebuffer in use. The colocated vLLM rollout takes "
            "rollout.gpuMemoryUtilization of it during generation and frees it (sleep) before the update.",
            targets(
                (
                    per_gpu(
                        f"{dcgm('DCGM_FI_DEV_FB_USED')} * 1048576",
                        GPU_MEM_NVML,
                        f"{ray_gpu('ray_node_gram_used')} * 1048576",
                    ),
                    "{{rljob}} {{pod}} gpu {{gpu}}",
                )
            ),
            "bytes",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "GPU memory free",
            "Per GPU framebuffer still free: the headroom for larger micro-batches "
            "or a higher rollout.gpuMemoryUtilization.",
            targets(
                (
                    per_gpu(
                        f"{dcgm('DCGM_FI_DEV_FB_FREE')} * 1048576",
                        None,
                        f"{ray_gpu('ray_node_gram_available')} * 1048576",
                    ),
                    "{{rljob}} {{pod}} gpu {{gpu}}",
                )
            ),
            "bytes",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Power draw",
            "Per GPU board power (DCGM_FI_DEV_POWER_USAGE).",
            targets(
                (
                    per_gpu(
                        dcgm("DCGM_FI_DEV_POWER_USAGE"), None, f"{ray_gpu('ray_node_gpu_power_milliwatts')} / 1000"
                    ),
                    "{{rljob}} {{pod}} gpu {{gpu}}",
                )
            ),
            "watt",
            min_=0,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Temperature",
            "Per GPU core temperature (DCGM_FI_DEV_GPU_TEMP).",
            targets(
                (
                    per_gpu(dcgm("DCGM_FI_DEV_GPU_TEMP"), None, ray_gpu("ray_node_gpu_temperature_celsius")),
                    "{{rljob}} {{pod}} gpu {{gpu}}",
                )
            ),
            "celsius",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "NVLink traffic",
            "Per GPU bytes per second over NVLink (DCGM profiling): FSDP collectives "
            "and the weight sync to the rollout engines.",
            targets(
                (
                    f"max by (rljob, pod, gpu) ({dcgm('DCGM_FI_PROF_NVLINK_TX_BYTES')})",
                    "tx {{rljob}} {{pod}} gpu {{gpu}}",
                ),
                (
                    f"max by (rljob, pod, gpu) ({dcgm('DCGM_FI_PROF_NVLINK_RX_BYTES')})",
                    "rx {{rljob}} {{pod}} gpu {{gpu}}",
                ),
            ),
            "Bps",
            min_=0,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Trainer peak memory",
            "torch's peak allocated and reserved GPU memory over the training "
            "ranks (perf/max_memory_allocated_gb, perf/max_memory_reserved_gb); with a colocated vLLM engine "
            "both include its pool (weights and KV cache, perf/engine_pool_gb), counted even while it sleeps: "
            "subtract it for the trainer's own. Close to the GPU's size means a longer batch may OOM (lower "
            "ppoMicroBatchSizePerGPU or enable offload).",
            targets(
                (
                    f"max by (rljob) ({kuberl('kuberl_perf_max_memory_allocated_bytes')})",
                    "allocated {{rljob}}",
                ),
                (f"max by (rljob) ({kuberl('kuberl_perf_max_memory_reserved_bytes')})", "reserved {{rljob}}"),
                (
                    f"max by (rljob) ({kuberl('kuberl_perf_engine_pool_bytes')})",
                    "colocated engine's pool {{rljob}}",
                ),
            ),
            "bytes",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "XID errors",
            "The last XID error code per GPU (DCGM_FI_DEV_XID_ERRORS); non-zero means the "
            "driver reported a fault (e.g. 79: GPU fell off the bus, 48: double-bit ECC).",
            targets((f"max by (rljob, pod, gpu) ({dcgm('DCGM_FI_DEV_XID_ERRORS')})", "{{rljob}} {{pod}} gpu {{gpu}}")),
            "none",
            min_=0,
            decimals=0,
        ),
        12,
        8,
    )
    return dashboard(
        "kuberl-gpu",
        "kuberl / GPU utilization",
        "GPU utilization, memory, power and tensor-core activity of RLJobs, per GPU and pod "
        "(DCGM exporter, falling back to the trainer's NVML series and Ray's).",
        lay,
        job_variables("kuberl_step"),
    )


def training_dashboard() -> dict[str, Any]:
    lay = Layout()
    lay.add(
        stat(
            "Step",
            "Training steps completed (kuberl_step).",
            targets((f"max by (rljob) ({kuberl('kuberl_step')})", "{{rljob}}")),
            decimals=0,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Progress",
            "kuberl_step / kuberl_total_steps.",
            targets(
                (
                    f"max by (rljob) ({kuberl('kuberl_step')}) / max by (rljob) ({kuberl('kuberl_total_steps')})",
                    "{{rljob}}",
                )
            ),
            "percentunit",
            decimals=0,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Reward (mean)",
            "Mean sequence score of the last step's responses (critic/score/mean).",
            targets((f"max by (rljob) ({kuberl('kuberl_critic_score_mean')})", "{{rljob}}")),
            decimals=3,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Tokens/s per GPU",
            "Prompt + response tokens processed per second per GPU (perf/throughput).",
            targets((f"max by (rljob) ({kuberl('kuberl_perf_throughput_tokens_per_second')})", "{{rljob}}")),
            decimals=0,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "MFU (actor)",
            "Model FLOPs utilization of the actor update (perf/mfu/actor).",
            targets((f"max by (rljob) ({kuberl('kuberl_perf_mfu_actor_ratio')})", "{{rljob}}")),
            "percentunit",
            decimals=1,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Step time",
            "Wall time of the last step (timing_s/step).",
            targets((f"max by (rljob) ({kuberl('kuberl_timing_step_seconds')})", "{{rljob}}")),
            "s",
            decimals=1,
        ),
        4,
        4,
    )

    lay.row("Reward and policy")
    lay.add(
        timeseries(
            "Reward",
            "Sequence score of the rollout responses: mean, min and max over the batch "
            "(critic/score/*). Rising mean = learning; max stuck at min = no signal for GRPO.",
            targets(
                (kuberl("kuberl_critic_score_mean"), "mean {{rljob}}"),
                (kuberl("kuberl_critic_score_max"), "max {{rljob}}"),
                (kuberl("kuberl_critic_score_min"), "min {{rljob}}"),
            ),
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "KL to the reference policy",
            "actor/kl_loss (KL loss in the actor objective, GRPO's way) "
            "and actor/reward_kl_penalty (KL subtracted from the rewards, PPO's way). A KL that keeps "
            "growing = the policy drifts; raise algorithm.kl.coef.",
            targets(
                (kuberl("kuberl_actor_kl_loss"), "kl_loss {{rljob}}"),
                (kuberl("kuberl_actor_reward_kl_penalty"), "reward_kl_penalty {{rljob}}"),
            ),
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Entropy",
            "Mean token entropy of the policy on its own responses (actor/entropy). "
            "A collapse towards 0 = the policy stopped exploring.",
            targets((kuberl("kuberl_actor_entropy"), "{{rljob}}")),
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Policy loss and clipping",
            "actor/pg_loss and the fraction of tokens clipped by the PPO ratio "
            "(actor/pg_clipfrac); clipfrac above ~0.2 = updates too large for the clip range.",
            targets(
                (kuberl("kuberl_actor_pg_loss"), "pg_loss {{rljob}}"),
                (kuberl("kuberl_actor_pg_clipfrac"), "pg_clipfrac {{rljob}}"),
            ),
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Gradient norm",
            "Actor gradient norm before clipping (actor/grad_norm).",
            targets((kuberl("kuberl_actor_grad_norm"), "{{rljob}}")),
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Response length",
            "Mean and max response tokens (response_length/*) and the fraction that hit "
            "data.maxResponseLength (clip_ratio: truncated answers).",
            targets(
                (kuberl("kuberl_response_length_mean"), "mean {{rljob}}"),
                (kuberl("kuberl_response_length_max"), "max {{rljob}}"),
            ),
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Truncated responses",
            "Fraction of responses cut at data.maxResponseLength (response_length/clip_ratio).",
            targets((kuberl("kuberl_response_length_clip_ratio"), "{{rljob}}")),
            "percentunit",
            min_=0,
            max_=1,
        ),
        12,
        8,
    )

    lay.add(
        timeseries(
            "Validation score",
            "Mean validation reward per data source (val-core/<data_source>/reward/mean@n), every trainer.testFreq "
            "steps: kuberl_val_core_reward_mean{data_source, n}.",
            targets(
                (
                    f"max by (rljob, data_source, n) ({kuberl('kuberl_val_core_reward_mean')})",
                    "{{rljob}} {{data_source}} mean@{{n}}",
                )
            ),
            decimals=3,
        ),
        12,
        8,
    )

    lay.row("Time and throughput")
    phases = (
        f'max by (rljob, phase) (label_replace({{__name__=~"kuberl_timing_.+_seconds", '
        f'__name__!~"kuberl_timing_(step|overlap)_seconds", {JOB}}}, "phase", "$1", "__name__", '
        '"kuberl_timing_(.+)_seconds"))'
    )
    lay.add(
        timeseries(
            "Step time breakdown",
            "Seconds per phase of the last step (timing_s/*): gen (rollout), "
            "reward, old_log_prob, ref, values, adv, update_critic, update_actor, weight sync, testing, "
            "save_checkpoint. Stacked, they add up to about the step time (the line). With rollout.overlap "
            "oneStepOffPolicy gen and reward ran during the previous step and gen_wait is the trainer's idle wait "
            "for a generation that outlasted the update.",
            targets((phases, "{{rljob}} {{phase}}"), (kuberl("kuberl_timing_step_seconds"), "step {{rljob}}")),
            "s",
            stack=True,
            min_=0,
        ),
        12,
        9,
    )
    lay.add(
        timeseries(
            "Generation share of the step",
            "timing_s/gen / timing_s/step: rollout-bound above ~0.6 "
            "(more rollout GPUs, larger maxNumSeqs), update-bound below.",
            targets(
                (
                    f"max by (rljob) ({kuberl('kuberl_timing_gen_seconds')}) / "
                    f"max by (rljob) ({kuberl('kuberl_timing_step_seconds')})",
                    "{{rljob}}",
                )
            ),
            "percentunit",
            min_=0,
            max_=1,
        ),
        12,
        9,
    )
    lay.add(
        timeseries(
            "Rollout vs training time",
            "Seconds of the last step spent generating (timing_s/gen), computing log-probs, values, advantages "
            "and updates (old_log_prob, ref, values, adv, update_actor, update_critic), and syncing weights to "
            "the rollout (update_weights).",
            targets(
                (f"max by (rljob) ({kuberl('kuberl_timing_gen_seconds')})", "rollout {{rljob}}"),
                (
                    f'sum by (rljob) ({{__name__=~"kuberl_timing_({TRAINING_PHASES})_seconds", {JOB}}})',
                    "training {{rljob}}",
                ),
                (f"max by (rljob) ({kuberl('kuberl_timing_update_weights_seconds')})", "weight sync {{rljob}}"),
            ),
            "s",
            stack=True,
            min_=0,
        ),
        12,
        9,
    )
    lay.add(
        timeseries(
            "Throughput",
            "Tokens per second per GPU (perf/throughput).",
            targets((kuberl("kuberl_perf_throughput_tokens_per_second"), "{{rljob}}")),
            "short",
            min_=0,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "MFU (actor)",
            "Model FLOPs utilization of the actor update (perf/mfu/actor).",
            targets((kuberl("kuberl_perf_mfu_actor_ratio"), "{{rljob}}")),
            "percentunit",
            min_=0,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Rollout staleness",
            "Steps between the policy a step trains and the weights its batch was generated with "
            "(rollout/staleness): 0 synchronous, 1 with rollout.overlap oneStepOffPolicy after the first step, at "
            "most rollout.maxStaleness with async; the trainer stops the run if it is ever larger.",
            targets((f"max by (rljob) ({kuberl('kuberl_rollout_staleness')})", "{{rljob}}")),
            "short",
            min_=0,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Steps per hour",
            "Training speed from kuberl_step.",
            targets((f"max by (rljob) (deriv({kuberl('kuberl_step')}[$__rate_interval])) * 3600", "{{rljob}}")),
            "short",
            min_=0,
        ),
        8,
        8,
    )
    return dashboard(
        "kuberl-training",
        "kuberl / RL training",
        "Reward, KL, entropy, response length, step-time breakdown, throughput and MFU of RLJobs "
        "(the trainer's kuberl_* series: verl's metric names).",
        lay,
        job_variables("kuberl_step"),
    )


def operator_dashboard() -> dict[str, Any]:
    lay = Layout()
    op = 'namespace="$namespace"'
    lay.add(
        bargauge(
            "RLJobs by phase",
            "RLJobs the operator watches, by status.phase (kuberl_operator_rljobs).",
            targets((f"sum by (phase) (kuberl_operator_rljobs{{{op}}})", "{{phase}}"), instant=True),
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "RLJobs by phase over time",
            "kuberl_operator_rljobs{phase}.",
            targets((f"sum by (phase) (kuberl_operator_rljobs{{{op}}})", "{{phase}}")),
            "short",
            stack=True,
            min_=0,
            decimals=0,
        ),
        16,
        8,
    )
    lay.row("Reconcile")
    lay.add(
        timeseries(
            "Reconcile latency",
            "p50 and p99 of the time one handler run takes, per handler (kuberl_operator_reconcile_duration_seconds).",
            targets(
                (
                    f"histogram_quantile(0.5, sum by (le, handler) (rate("
                    f"kuberl_operator_reconcile_duration_seconds_bucket{{{op}}}[$__rate_interval])))",
                    "p50 {{handler}}",
                ),
                (
                    f"histogram_quantile(0.99, sum by (le, handler) (rate("
                    f"kuberl_operator_reconcile_duration_seconds_bucket{{{op}}}[$__rate_interval])))",
                    "p99 {{handler}}",
                ),
            ),
            "s",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Reconciles per second",
            "Handler runs per second, per handler.",
            targets(
                (
                    f"sum by (handler) (rate(kuberl_operator_reconcile_duration_seconds_count{{{op}}}"
                    f"[$__rate_interval]))",
                    "{{handler}}",
                )
            ),
            "ops",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Reconcile errors",
            "Handler runs that raised, per second (kuberl_operator_reconcile_errors_total); "
            "kopf retries temporary errors. The operator's log and the RLJob's Events say why.",
            targets(
                (
                    f"sum by (handler) (rate(kuberl_operator_reconcile_errors_total{{{op}}}[$__rate_interval]))",
                    "{{handler}}",
                )
            ),
            "ops",
            min_=0,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "RayJob restarts",
            "RayJob retries (a new Ray cluster after a failed attempt) seen by the "
            "operator in the window (kuberl_operator_restarts_total); the trainer resumes from the last "
            "checkpoint.",
            targets((f"sum (increase(kuberl_operator_restarts_total{{{op}}}[$__rate_interval]))", "restarts")),
            "short",
            min_=0,
        ),
        12,
        8,
    )
    lay.row("RLJobs")
    lay.add(
        bargauge(
            "Training progress",
            "kuberl_step / kuberl_total_steps of the selected RLJobs (trainer series).",
            targets(
                (
                    'max by (namespace, rljob) (kuberl_step{rljob=~"$rljob"}) / '
                    'max by (namespace, rljob) (kuberl_total_steps{rljob=~"$rljob"})',
                    "{{namespace}}/{{rljob}}",
                ),
                instant=True,
            ),
            "percentunit",
            max_=1,
        ),
        24,
        6,
    )
    lay.add(
        timeseries(
            "Rollout engines over time",
            "Rollout engines each RLJob's trainer generates with (rollout/engines, status.progress.rolloutEngines). "
            "A separate rollout pool follows cluster.rollout.nodes, which may change while the job runs: after a "
            "resize, or a rollout pod lost, the count follows as pods join and leave. At 0 the trainer waits (the "
            "RLJob's condition RolloutPoolEmpty) up to runPolicy.emptyRolloutPoolTimeoutSeconds. The pods the "
            "operator asks for and finds ready are kuberl_operator_rollout_pods{state}.",
            targets(('max by (namespace, rljob) (kuberl_rollout_engines{rljob=~"$rljob"})', "{{namespace}}/{{rljob}}")),
            "short",
            min_=0,
            decimals=0,
        ),
        24,
        8,
    )
    variables = [
        variable("namespace", "Operator namespace", "label_values(kuberl_operator_rljobs, namespace)"),
        variable("rljob", "RLJob", "label_values(kuberl_step, rljob)", multi=True),
    ]
    return dashboard(
        "kuberl-operator",
        "kuberl / operator",
        "The kuberl operator: RLJobs by phase, reconcile latency (p50/p99), errors and RayJob restarts; per RLJob "
        "its progress and rollout engines.",
        lay,
        variables,
        refresh="1m",
    )


DASHBOARDS = {"gpu.json": gpu_dashboard, "training.json": training_dashboard, "operator.json": operator_dashboard}


def render() -> dict[str, str]:
    return {name: json.dumps(make(), indent=2) + "\n" for name, make in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    stale = []
    for name, text in render().items():
        path = HERE / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(
            f"stale dashboards {', '.join(stale)}: run `python charts/kuberl/dashboards/generate.py`", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
