"""The operator's Prometheus metrics: names, labels, and what moves them."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from kuberl.operator import metrics


def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels or {})


def test_rljobs_gauge_counts_by_phase_and_forgets_deleted_objects() -> None:
    tracker = metrics.PhaseTracker()
    tracker.observe("a", "Running")
    tracker.observe("b", "Running")
    tracker.observe("c", None)
    tracker.observe("a", "Succeeded")
    tracker.forget("b")
    counts = tracker.counts()
    assert counts["Succeeded"] == 1
    assert counts["Running"] == 0
    assert counts["Unknown"] == 1
    assert set(counts) >= {"Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"}


def test_rljobs_gauge_is_exported_with_a_phase_label() -> None:
    metrics.PHASES.observe("uid-metrics-test", "Failed")
    try:
        assert sample("kuberl_operator_rljobs", {"phase": "Failed"}) >= 1
        assert b'kuberl_operator_rljobs{phase="Pending"}' in generate_latest(metrics.REGISTRY)
    finally:
        metrics.PHASES.forget("uid-metrics-test")


def test_reconciling_times_each_run_and_counts_errors() -> None:
    before_count = sample("kuberl_operator_reconcile_duration_seconds_count", {"handler": "test"}) or 0
    before_errors = sample("kuberl_operator_reconcile_errors_total", {"handler": "test"}) or 0
    with metrics.reconciling("test"):
        pass
    with pytest.raises(RuntimeError), metrics.reconciling("test"):
        raise RuntimeError("boom")
    assert sample("kuberl_operator_reconcile_duration_seconds_count", {"handler": "test"}) == before_count + 2
    assert sample("kuberl_operator_reconcile_errors_total", {"handler": "test"}) == before_errors + 1


def test_restarts_total_is_a_counter() -> None:
    before = sample("kuberl_operator_restarts_total") or 0
    metrics.RESTARTS.inc(2)
    assert sample("kuberl_operator_restarts_total") == before + 2
