"""An RLJob's sandbox spec as the sandbox applies it."""

from __future__ import annotations

from kuberl.api.spec import SandboxExecution
from kuberl.sandbox.protocol import Limits


def limits_of(execution: SandboxExecution) -> Limits:
    return Limits(
        wall_seconds=execution.wall_seconds,
        cpu_seconds=execution.cpu_seconds,
        memory_mb=execution.memory_mb,
        processes=execution.processes,
        disk_mb=execution.disk_mb,
        open_files=execution.open_files,
        output_bytes=execution.output_bytes,
    )
