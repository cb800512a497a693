"""Fixtures shared by the trainer tests that place workers on Ray."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A private local Ray for one test module (never an existing cluster on the machine)."""
    import ray

    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        num_cpus=max(4, os.cpu_count() or 1),
        include_dashboard=False,
        log_to_driver=False,
    )
    yield
    ray.shutdown()
