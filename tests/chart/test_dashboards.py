"""The Grafana dashboards, read as JSON: structure, variables, and metric names checked against the code that
exports them (the operator's registry, the trainer's naming rule) and the recorded DCGM/Ray samples.
e2e/chart/test_prometheus.py runs every query against a real Prometheus."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.chart.rendering import CHART, REPO

DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
SAMPLES = REPO / "e2e" / "chart"
METRIC = re.compile(r"\b(kuberl_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+|ray_[a-z0-9_]+)\b")

# verl's metric names the training/GPU dashboards read, and the Prometheus names the trainer's rule gives them
VERL_KEYS = {
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "actor/kl_loss",
    "actor/reward_kl_penalty",
    "actor/entropy",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "timing_s/gen",
    "timing_s/step",
    "perf/throughput",
    "perf/mfu/actor",
    "perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "perf/engine_pool_gb",  # a colocated engine's pool, inside the two above
    "timing_s/update_weights",
    "rollout/staleness",
    "rollout/engines",  # the engines the trainer generates with (issue 36; status.progress.rolloutEngines)
    "val-core/gsm8k/reward/mean@1",
}
# per-GPU keys `gpu/<rank>/<stat>` become kuberl_gpu_<stat in base units>{gpu="<rank>"}
# (trainer/kuberl/trainer/experience/metrics.py perf_metrics: NVML `utilization` in percent, `memory_used_gb` in GiB)
GPU_STATS = {"utilization", "memory_used_gb"}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p["targets"]]


def test_there_are_the_three_dashboards():
    assert [p.name for p in DASHBOARDS] == ["gpu.json", "operator.json", "training.json"]
    assert len({load(p)["uid"] for p in DASHBOARDS}) == 3


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_has_datasource_namespace_and_rljob_variables(path: Path):
    variables = {v["name"]: v for v in load(path)["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "rljob"):
        assert variables[name]["type"] == "query"
        assert variables[name]["definition"].startswith("label_values(")
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert variables["rljob"]["multi"] and variables["rljob"]["includeAll"]
    if path.stem != "operator":  # the operator's own namespace is one; RLJobs may live in several
        assert variables["namespace"]["multi"] and variables["namespace"]["includeAll"]


@pytest.mark.parametrize("path", [p for p in DASHBOARDS if p.stem != "operator"], ids=lambda p: p.stem)
def test_every_series_of_a_job_dashboard_names_its_rljob(path: Path):
    for panel in panels(load(path)):
        for target in panel["targets"]:
            assert "{{rljob}}" in target["legendFormat"], (panel["title"], target["legendFormat"])


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panels_have_ids_titles_descriptions_queries_and_fit_the_grid(path: Path):
    dashboard = load(path)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["title"] and panel["description"], panel["title"]
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        assert all(t["expr"].strip() for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_job_panels_filter_by_the_selected_namespace_and_rljobs(path: Path):
    for panel in panels(load(path)):
        for target in panel["targets"]:
            if "kuberl_operator_" in target["expr"]:
                continue
            assert 'rljob=~"$rljob"' in target["expr"], (panel["title"], target["expr"])
            assert 'namespace="$namespace"' not in target["expr"], "namespace is multi-select: =~"


def test_operator_dashboard_reads_only_series_the_operator_exports():
    from prometheus_client import CollectorRegistry

    from kuberl.operator import metrics

    exported: set[str] = set()
    registry: CollectorRegistry = metrics.REGISTRY
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
        exported |= {family.name + s for s in suffixes}
    used = {
        m
        for e in exprs(load(CHART / "dashboards" / "operator.json"))
        for m in METRIC.findall(e)
        if m.startswith("kuberl_operator_")
    }
    assert used == {
        "kuberl_operator_rljobs",
        "kuberl_operator_reconcile_duration_seconds_bucket",
        "kuberl_operator_reconcile_duration_seconds_count",
        "kuberl_operator_reconcile_errors_total",
        "kuberl_operator_restarts_total",
    }
    assert used <= exported, f"not exported by kuberl.operator.metrics: {used - exported}"


def test_trainer_series_in_the_dashboards_follow_the_trainers_naming_rule():
    from kuberl.trainer.observe.metrics import prometheus_series

    expected = {prometheus_series(k, 1.0)[0] for k in VERL_KEYS} | {"kuberl_step", "kuberl_total_steps"}
    expected |= {prometheus_series(f"gpu/0/{s}", 1.0)[0] for s in GPU_STATS}
    used = {
        m
        for p in DASHBOARDS
        for e in exprs(load(p))
        for m in METRIC.findall(e)
        if m.startswith("kuberl_") and not m.startswith("kuberl_operator_")
    }
    used.discard("kuberl_timing_")  # the regexes kuberl_timing_.+_seconds and kuberl_timing_(old_log_prob|...)_seconds
    assert used == expected


def test_trainer_prometheus_sink_exports_the_names_the_dashboards_read():
    from kuberl.trainer.observe.metrics import PrometheusSink

    sink = PrometheusSink(0, rljob="r", namespace="ns", total_steps=10)
    sink.log(1, {**{k: 1.0 for k in VERL_KEYS}, **{f"gpu/0/{s}": 1.0 for s in GPU_STATS}})
    exported = set(re.findall(r"^(kuberl_\w+)\{", sink.text(), re.M))
    used = {m for p in DASHBOARDS for e in exprs(load(p)) for m in METRIC.findall(e) if m.startswith("kuberl_")} - {
        "kuberl_timing_"
    }
    assert {u for u in used if not u.startswith("kuberl_operator_")} <= exported


@pytest.mark.parametrize(
    ("dashboard", "sample", "prefix"),
    [
        ("gpu.json", "dcgm-sample.prom", "DCGM_FI_"),
        ("gpu.json", "ray-sample.prom", "ray_"),
    ],
)
def test_exporter_series_in_the_dashboards_exist_in_the_recorded_samples(dashboard: str, sample: str, prefix: str):
    recorded = set(re.findall(r"^# TYPE (\S+)", (SAMPLES / sample).read_text(), re.M))
    used = {m for e in exprs(load(CHART / "dashboards" / dashboard)) for m in METRIC.findall(e) if m.startswith(prefix)}
    assert used and used <= recorded, f"not in {sample}: {used - recorded}"
