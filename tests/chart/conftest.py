"""Fixtures of the chart tests: the helm binary (from the e2e harness's tool dir) and a private helm home."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.harness import INSTALL_HINT, Tools


def missing_tool(message: str) -> None:
    """Skip the test, or fail it under CI=true (CI builds the tools first, so a missing one is a bug)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{message} (CI=true: it must be installed before pytest)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm from `bash e2e/tools.sh install` (KUBERL_HELM overrides the path)."""
    path = Tools.from_env().path("helm")
    if not os.access(path, os.X_OK):
        missing_tool(f"helm not built at {path}: run `{INSTALL_HINT}` (or set KUBERL_HELM)")
    return path


@pytest.fixture(scope="session")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")
