"""RLJob specs with sandbox pools, and those pools served as `kuberl run` serves them: real local servers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.fixtures import in_ci
from kuberl.api import RLJobSpec, parse_spec
from kuberl.sandbox import isolation
from kuberl.sandbox.client import PoolAddress
from kuberl.trainer.sandboxes import announced_pools
from tests.trainer.kuberl_cli import tiny_job

EXECUTION = {"wallSeconds": 2, "cpuSeconds": 1, "memoryMb": 256, "processes": 8, "diskMb": 4, "outputBytes": 4096}
"""Small limits: a hostile program costs a test two seconds at most."""


def spec_with_pools(*, reward: dict[str, Any] | None = None, tools: dict[str, Any] | None = None) -> RLJobSpec:
    """The tiny digits job with `reward.sandbox` and/or `rollout.agent.sandbox` (with the python tool) as given."""
    spec = tiny_job("pools", "/tmp/unused")["spec"]
    if reward is not None:
        spec["reward"] = {"function": "code_tests", "sandbox": {"execution": EXECUTION, **reward}}
    if tools is not None:
        spec["rollout"]["agent"] = {"tools": [{"name": "python"}], "sandbox": {"execution": EXECUTION, **tools}}
    return parse_spec(spec)


def require_isolation() -> None:
    """Skip where this machine cannot isolate programs (CI must)."""
    try:
        isolation.decide("auto")
    except isolation.SandboxUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI must be able to run sandboxes: {exc}", pytrace=False)
        pytest.skip(str(exc))


@contextlib.contextmanager
def served(spec: RLJobSpec, run_dir: Path, **addresses: str) -> Iterator[dict[str, PoolAddress]]:
    """`spec`'s pools announced in this process, local servers for those without an address."""
    require_isolation()
    with announced_pools(spec, addresses, run_dir) as pools:
        yield pools
