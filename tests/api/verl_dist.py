"""verl's published wheel from PyPI, fetched once into the cache and checked against its pinned sha256.

The import corpus is the configuration files it ships (`verl/**/*.yaml`: the trainer configs, their config
groups, the experimental trainers'); verl's sdist holds no `examples/` or `recipe/` launch scripts. Nothing of it
is kept in this repository: it is data the tests read, never code they run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERL_VERSION = "0.9.1"
WHEEL = f"verl-{VERL_VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14"
CACHE = Path(os.environ.get("KUBERL_CACHE_DIR", Path.home() / ".cache" / "kuberl")) / f"verl-{VERL_VERSION}"
CONFIG = "verl/trainer/config"


class Unavailable(LookupError):
    """The wheel could not be fetched (offline): the one-line reason."""


def verl_distribution() -> Path:
    """The folder holding the wheel's `verl/**/*.yaml`, fetched and unpacked on first use."""
    unpacked = CACHE / "unpacked"
    if (unpacked / CONFIG / "ppo_trainer.yaml").is_file():
        return unpacked
    wheel = CACHE / WHEEL
    if not wheel.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        command += ["--dest", str(CACHE), f"verl=={VERL_VERSION}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0 or not wheel.is_file():
            reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"pip download verl=={VERL_VERSION} failed: {reason}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        wheel.unlink()
        raise AssertionError(f"{WHEEL}: sha256 {digest}, pinned {WHEEL_SHA256}: the download was removed")
    with tempfile.TemporaryDirectory(dir=CACHE) as staging, zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("verl/") and member.endswith(".yaml"):
                archive.extract(member, staging)
        shutil.rmtree(unpacked, ignore_errors=True)
        Path(staging).rename(unpacked)
        Path(staging).mkdir()  # for TemporaryDirectory's cleanup
    return unpacked
