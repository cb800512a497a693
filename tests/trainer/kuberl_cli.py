"""`kuberl run` as a user starts it: a process of its own, from the repository root, importing this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout's three package folders first on PYTHONPATH."""
    path = [str(REPO / p) for p in ("api", "operator", "trainer")] + [os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def run_command(spec_file: Path | str, run_dir: Path | str) -> list[str]:
    """`kuberl run SPEC --run-dir DIR --no-progress` with this interpreter."""
    return [sys.executable, "-m", "kuberl.cli", "run", str(spec_file), "--run-dir", str(run_dir), "--no-progress"]


def kuberl_run(spec_file: Path | str, run_dir: Path | str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `kuberl run` to its end from the repository root; output captured as text."""
    command = run_command(spec_file, run_dir)
    return subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=timeout)
