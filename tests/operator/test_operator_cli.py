"""`python -m kuberl.operator` command line."""

from __future__ import annotations

import pytest

from kuberl.operator.__main__ import parse_args


def test_namespaces_are_repeatable_and_comma_separated() -> None:
    cfg = parse_args(["--namespace", "a", "-n", "b,c", "--metrics-port", "9000", "--health-port", "9001"])
    assert cfg.namespaces == ("a", "b", "c")
    assert not cfg.all_namespaces
    assert (cfg.metrics_port, cfg.health_port) == (9000, 9001)


def test_all_namespaces_and_defaults() -> None:
    cfg = parse_args(["--all-namespaces"])
    assert cfg.all_namespaces and cfg.namespaces == ()
    assert (cfg.metrics_port, cfg.health_port, cfg.max_workers) == (8080, 8081, 16)


def test_namespaces_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERL_NAMESPACES", "x,y")
    assert parse_args([]).namespaces == ("x", "y")


def test_a_scope_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERL_NAMESPACES", raising=False)
    with pytest.raises(SystemExit):
        parse_args([])


def test_namespace_and_all_namespaces_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "a", "--all-namespaces"])
