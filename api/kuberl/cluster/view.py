"""What `kuberl status` and `--follow` print: pure functions of the RLJob and its pods as the API returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kuberl.api.contract import TIMESTAMP_FORMAT
from kuberl.api.status import TERMINAL_PHASES, Phase, duration_summary

NODE_TYPE_LABEL = "ray.io/node-type"  # KubeRay's label of a Ray pod: head or worker
GROUP_LABEL = "ray.io/group"  # KubeRay's label of a worker pod: its worker group (trainer, rollout)
JOB_LABEL = "batch.kubernetes.io/job-name"  # on the pods of a Job: KubeRay's submitter


def is_terminal(rljob: dict[str, Any]) -> bool:
    return phase_of(rljob) in {p.value for p in TERMINAL_PHASES}


def phase_of(rljob: dict[str, Any]) -> str:
    return str((rljob.get("status") or {}).get("phase") or Phase.PENDING.value)


def progress_line(rljob: dict[str, Any]) -> str:
    """One line of progress: phase, step of total (percent), reward, ETA; what `--follow` prints on each change."""
    status = rljob.get("status") or {}
    progress = status.get("progress") or {}
    parts = [phase_of(rljob)]
    if "step" in progress:
        total = progress.get("totalSteps")
        step = f"step {progress['step']}" + (f"/{total}" if total else "")
        if progress.get("percentComplete") is not None:
            step += f" ({progress['percentComplete']}%)"
        parts.append(step)
    if progress.get("rewardMean") is not None:
        parts.append(f"reward {progress['rewardMean']:.4g}")
    if progress.get("estimatedRemainingTimeSummary"):
        parts.append(f"ETA {progress['estimatedRemainingTimeSummary']}")
    blocking = [c for c in status.get("conditions") or [] if c.get("status") == "False" and c.get("reason")]
    parts += [f"{c['type']}={c['status']} {c['reason']}" for c in blocking]
    if status.get("message") and (blocking or phase_of(rljob) != Phase.RUNNING.value):
        parts.append(str(status["message"]))
    return "  ".join(parts)


def status_text(rljob: dict[str, Any], pods: list[dict[str, Any]], now: datetime) -> str:
    """`kuberl status NAME`: phase and since when, progress, conditions with reasons, failure, pods."""
    metadata, status = rljob["metadata"], rljob.get("status") or {}
    progress = status.get("progress") or {}
    lines = [f"RLJob {metadata['name']} in {metadata.get('namespace', '?')}: {phase_of(rljob)}{_since(status, now)}"]
    if status.get("message"):
        lines.append(f"  {status['message']}")
    if progress:
        lines.append("  progress: " + progress_line({"status": {"progress": progress}}).removeprefix("Pending  "))
        if progress.get("tokensPerSecond") is not None:
            lines.append(f"  throughput: {progress['tokensPerSecond']:,.0f} tokens/s")
        if progress.get("lastCheckpoint"):
            lines.append(f"  last checkpoint: {progress['lastCheckpoint']}")
        if progress.get("updatedAt"):
            lines.append(f"  reported: {progress['updatedAt']}{_ago(progress['updatedAt'], now)}")
        failure = progress.get("failure")
        if failure:
            lines.append(f"  failure ({failure.get('kind')}): {failure.get('error')}: {failure.get('message', '')}")
    restarts = status.get("restarts") or 0
    if status.get("rayJobName") or restarts:
        lines.append(
            f"  RayJob {status.get('rayJobName', '-')}, RayCluster {status.get('rayClusterName', '-')}, "
            f"restarts {restarts}"
        )
    conditions = status.get("conditions") or []
    if conditions:
        lines.append("  conditions:")
        width = max(len(f"{c['type']}={c['status']}") for c in conditions)
        for c in conditions:
            head = f"{c['type']}={c['status']}"
            lines.append(f"    {head:<{width}}  {c.get('reason', '')}: {c.get('message', '')}".rstrip(": "))
    lines.append("  pods:" if pods else "  pods: none")
    rows = [pod_row(p) for p in sorted(pods, key=lambda p: p["metadata"]["name"])]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
    lines += ["    " + "  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(row)).rstrip() for row in rows]
    return "\n".join(lines)


def pod_row(pod: dict[str, Any]) -> tuple[str, str, str, str, str, str]:
    """(name, role, phase or the waiting reason, ready, restarts, node)."""
    labels = pod["metadata"].get("labels") or {}
    role = labels.get(NODE_TYPE_LABEL, "")
    if role == "worker":
        role = labels.get(GROUP_LABEL, role)
    elif JOB_LABEL in labels:
        role = "submitter"
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    waiting = next(
        (c["state"]["waiting"].get("reason") for c in containers if (c.get("state") or {}).get("waiting")), None
    )
    scheduled: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    state = (
        waiting or (scheduled.get("reason") if scheduled.get("status") == "False" else None) or status.get("phase", "?")
    )
    if pod["metadata"].get("deletionTimestamp"):
        state = "Terminating"
    ready = sum(1 for c in containers if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    spec_containers = len((pod.get("spec") or {}).get("containers") or []) or len(containers)
    node = (pod.get("spec") or {}).get("nodeName") or "-"
    return pod["metadata"]["name"], role or "-", str(state), f"{ready}/{spec_containers}", f"restarts {restarts}", node


def _parse(timestamp: str) -> datetime | None:
    try:
        return datetime.strptime(timestamp, TIMESTAMP_FORMAT).replace(tzinfo=None)
    except (TypeError, ValueError):
        return None


def _ago(timestamp: str, now: datetime) -> str:
    at = _parse(timestamp)
    if at is None:
        return ""
    seconds = max(0, int((now.replace(tzinfo=None) - at).total_seconds()))
    return f" ({duration_summary(seconds)} ago)"


def _since(status: dict[str, Any], now: datetime) -> str:
    at = status.get("completionTime") or status.get("startTime")
    if not at:
        return ""
    word = "finished" if status.get("completionTime") else "started"
    return f", {word} {at}{_ago(at, now)}"
