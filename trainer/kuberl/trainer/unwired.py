"""Spec fields the API admits but this trainer's driver does not run yet: refused at start, never ignored.

Each entry names the field and the driver hook it waits for; remove an entry when its hook lands.
"""

from __future__ import annotations

from kuberl.api.spec import RLJobSpec


def unwired_fields(spec: RLJobSpec) -> list[str]:
    """One line per set field that the driver would otherwise silently ignore."""
    found = []
    if spec.algorithm.filter_groups.enabled:
        found.append(
            "algorithm.filterGroups.enabled: dynamic sampling's generation rounds are not in the driver yet "
            "(kuberl.trainer.dapo.DynamicSampler is ready for it)"
        )
    if spec.reward.overlong_buffer is not None:
        found.append(
            "reward.overlongBuffer: the overlong penalty is not added to the scores by the driver yet "
            "(kuberl.trainer.dapo.overlong_penalty is ready for it)"
        )
    if spec.algorithm.advantage_estimator == "remax":
        found.append(
            "algorithm.advantageEstimator remax: the driver does not generate and score the greedy baseline "
            "responses yet (kuberl.trainer.advantages.remax takes them as reward_baselines)"
        )
    return found


def refuse_unwired(spec: RLJobSpec) -> None:
    """Raise ValueError naming every admitted field this trainer cannot run yet."""
    found = unwired_fields(spec)
    if found:
        raise ValueError("this trainer cannot run the job yet; unset: " + "; ".join(found))
