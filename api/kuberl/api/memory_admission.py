"""Admission's memory verdict: an RLJob whose plan (memory.py) does not fit the GPU its trainer pool runs on is
refused by the operator before any RayJob exists, and by `kuberl validate` offline, with the text `kuberl plan`
prints (peak per GPU against the card, the largest budget that fits, the fixes with their numbers).

The plan needs two things admission can know only from the spec: the GPU model, from the pool's node selector
(`memory.gpu_of`: NVIDIA's or GKE's GPU label, an instance type of one GPU model), and the model's shape, from
`model.shape` (model.path is read in the pods only). Where either is unknown, or the label names a GPU the plan has
no size for, the job is admitted: the trainer plans with the model's own config at start and refuses it there.
"""

from __future__ import annotations

from kuberl.api.memory import MemoryPlan, declared_shape, does_not_fit, gpu_of, plan_memory
from kuberl.api.spec import RLJobSpec
from kuberl.api.validation import Issue

PLAN_FITS_RULE = "plan-fits"


def admission_plan(spec: RLJobSpec) -> MemoryPlan | None:
    """The plan on the trainer pool's GPU, or None where admission cannot know the GPU or the model's shape."""
    shape = declared_shape(spec)
    if spec.cluster.device != "cuda" or shape is None:
        return None
    try:
        gpu, rollout_gpu = gpu_of(spec), gpu_of(spec, "rollout")
    except ValueError:  # a GPU label naming a card the plan has no size for: unknown
        return None
    return None if gpu is None else plan_memory(spec, shape, gpu, rollout_gpu)


def plan_refusal(plan: MemoryPlan) -> str | None:
    """The refusal of a job whose plan does not fit its GPU, with the plan; None where it fits. The one verdict: the
    operator, `kuberl validate` and the trainer at start (plan/execution.py) refuse with it."""
    return None if plan.fits else does_not_fit("", plan)


def memory_issues(spec: RLJobSpec) -> list[Issue]:
    """The refusal of a job whose admission plan does not fit, with the plan; empty where it fits or is unknown."""
    plan = admission_plan(spec)
    refusal = None if plan is None else plan_refusal(plan)
    return [] if refusal is None else [Issue("spec", refusal, PLAN_FITS_RULE)]
