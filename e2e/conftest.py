"""Makes `pytest e2e` work on its own. When the root conftest already lists `pytest_plugins = ["e2e.fixtures"]`,
this registers nothing twice (pytest forbids `pytest_plugins` in a non-root conftest, hence the hook)."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("e2e.fixtures"):
        config.pluginmanager.import_plugin("e2e.fixtures")
