"""Fixtures shared by the trainer tests: a local Ray, small real filesystems."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

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


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """A tmpfs of the given size (optionally read-only) mounted under tmp_path; skipped where mounting is not allowed."""
    mounted: list[Path] = []

    def mount(size: str, read_only: bool = False) -> Path:
        target = tmp_path / f"fs{len(mounted)}"
        target.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {result.stderr.decode().strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], check=False)
