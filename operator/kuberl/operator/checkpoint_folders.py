"""One checkpoint folder, one RLJob: where an RLJob's checkpoints live, and which other RLJob already uses it.

A relative `trainer.checkpointDir` lies in the RLJob's own folder on the claim (`rayjob.job_folder`, by uid), so
only an absolute one can be shared: two RLJobs of a namespace on one claim (or one persistent volume) with the same
absolute folder. The trainer's start-up deletes unfinished step folders and rotates old ones, so two live jobs in
one folder destroy each other's checkpoints; the operator refuses the later of the two (`_order`: a job already
running keeps its folder, and of two new ones the older; a deterministic winner when both are created at once).
The other RLJobs are read only for an absolute folder: listing the namespace for every job made a burst of N
creations read N × N RLJobs (200 jobs: 40,000 RLJob objects decoded, the operator's peak RSS).
Pure functions of the RLJobs as read.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from kuberl.api.spec import RLJobSpec
from kuberl.operator.rayjob import claim_name_of, pod_view

Location = tuple[str, str]
"""(the volume the folder is on, the folder's path within it)."""

POD_LOCAL_SOURCES = frozenset({"emptyDir", "ephemeral"})  # a fresh volume per pod: never shared by two RLJobs


def checkpoint_location(spec: RLJobSpec, name: str, uid: str) -> Location | None:
    """Where RLJob `name`'s checkpoints live, in terms two RLJobs can compare; None when no other RLJob can see
    the folder (a pod-local volume, or no mounted volume at all)."""
    directory = posixpath.normpath(pod_view(spec, name, uid).trainer.checkpoint_dir)
    claim = claim_name_of(spec, name)
    if claim is not None:
        return f"claim {claim}", directory
    volumes = {v.name: v.model_extra or {} for v in spec.cluster.volumes}
    mounts = sorted(spec.cluster.volume_mounts, key=lambda m: -len(m.mount_path))
    for mount in mounts:
        root = mount.mount_path.rstrip("/") or "/"
        if directory != root and not directory.startswith(root.rstrip("/") + "/"):
            continue
        source = volumes.get(mount.name, {})
        if not source or POD_LOCAL_SOURCES & set(source):
            return None
        within = posixpath.normpath(posixpath.join("/", mount.sub_path or "", posixpath.relpath(directory, root)))
        return f"volume {json.dumps(source, sort_keys=True)}", within
    return None


def _refused(status: dict[str, Any]) -> bool:
    """Refused by the operator (Valid=False): it never ran, so it holds no folder."""
    return any(c.get("type") == "Valid" and c.get("status") == "False" for c in status.get("conditions") or [])


def _order(rljob: dict[str, Any]) -> tuple[bool, str, str]:
    """Which of two RLJobs keeps a folder: one that already has its RayJob, else the older (creationTimestamp
    counts seconds; the uid breaks a tie)."""
    meta = rljob["metadata"]
    live = bool((rljob.get("status") or {}).get("rayJobName"))
    return not live, str(meta.get("creationTimestamp") or ""), str(meta.get("uid") or "")


def shared_folder_issue(
    rljob: dict[str, Any], spec: RLJobSpec, list_others: Callable[[], list[dict[str, Any]]]
) -> str | None:
    """Why `rljob` may not use its checkpoint folder: an RLJob among `list_others()` (its namespace's, read only for
    an absolute folder) that comes first (`_order`) uses it."""
    meta = rljob["metadata"]
    mine = checkpoint_location(spec, meta["name"], meta["uid"])
    if mine is None or not posixpath.isabs(spec.trainer.checkpoint_dir):  # a relative one lies in the job's own
        return None
    for other in sorted(list_others(), key=_order):
        other_meta = other["metadata"]
        if other_meta.get("uid") == meta["uid"] or other_meta.get("deletionTimestamp"):
            continue
        if _refused(other.get("status") or {}) or _order(other) > _order(rljob):
            continue
        try:
            other_spec = RLJobSpec.model_validate(other.get("spec") or {})
        except ValidationError:
            continue
        if checkpoint_location(other_spec, other_meta["name"], other_meta["uid"]) == mine:
            return (
                f"spec.trainer.checkpointDir: {mine[1]} (on {mine[0].split(' {')[0]}) is the checkpoint folder of "
                f"RLJob {other_meta['name']} (uid {other_meta['uid']}), and one folder holds one job's checkpoints "
                "(each deletes the other's unfinished and oldest ones): use a relative checkpointDir (it lies in "
                "this RLJob's own folder) or another absolute one; to start from its checkpoints set trainer.resume "
                "to one of its global_step_N folders"
            )
    return None
