"""Invalid RLJobs, each with the field admission must refuse it on.

Shared by the offline tests (Python validator, CEL of the generated CRD) and the
apiserver tests in e2e/, which assert the server refuses each one with the same message.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BASE: dict[str, Any] = {
    "apiVersion": "kuberl.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "base"},
    "spec": {
        "model": {"path": "/models/policy"},
        "algorithm": {"advantageEstimator": "grpo"},
        "data": {"trainFiles": ["/data/train.parquet"], "valFiles": ["/data/val.parquet"]},
        "batch": {"trainBatchSize": 64, "rolloutN": 4, "ppoMiniBatchSize": 16, "ppoMicroBatchSizePerGPU": 4},
        "cluster": {"trainer": {"nodes": 1, "gpusPerNode": 8}},
    },
}


@dataclass(frozen=True)
class InvalidCase:
    name: str
    field: str
    """Dotted path from the object root that the refusal must name."""
    document: dict[str, Any]
    rule: str
    """Rule id of kuberl.api.rules, or "schema"."""
    message: str = ""
    """A fragment the message must contain (besides the field path)."""
    server_side: bool = True
    """False when the apiserver cannot refuse it (none today)."""
    tags: tuple[str, ...] = field(default_factory=tuple)


def _case(name: str, field: str, rule: str, edit: Callable[[dict[str, Any]], None], message: str = "") -> InvalidCase:
    doc = copy.deepcopy(BASE)
    doc["metadata"]["name"] = name
    edit(doc)
    return InvalidCase(name, field, doc, rule, message)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        node = doc
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


def _all(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for e in edits:
            e(doc)

    return edit


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        node = doc
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        del node[last]

    return edit


INVALID_CASES: list[InvalidCase] = [
    # verl's batch rules
    _case(
        "r1-responses-not-divisible",
        "spec.batch.trainBatchSize",
        "responses-divisible-by-dp",
        _all(
            _set("spec.batch.trainBatchSize", 6), _set("spec.batch.rolloutN", 2), _set("spec.batch.ppoMiniBatchSize", 6)
        ),
        "12 responses per step is not divisible by 8 trainer GPUs",
    ),
    _case(
        "r3-mini-exceeds-train",
        "spec.batch.ppoMiniBatchSize",
        "mini-batch-within-train-batch",
        _set("spec.batch.ppoMiniBatchSize", 128),
        "exceeds batch.trainBatchSize = 64",
    ),
    _case(
        "mini-batches-not-whole",
        "spec.batch.ppoMiniBatchSize",
        "mini-batches-whole",
        _set("spec.batch.ppoMiniBatchSize", 24),
        "not a multiple of batch.ppoMiniBatchSize = 24",
    ),
    _case(
        "r6-mini-not-divisible-by-dp",
        "spec.batch.ppoMiniBatchSize",
        "mini-batch-divisible-by-dp",
        _all(_set("spec.batch.ppoMiniBatchSize", 3), _set("spec.batch.trainBatchSize", 48)),
        "= 12 is not divisible by 8 trainer GPUs",
    ),
    _case(
        "r6-micro-not-dividing",
        "spec.batch.ppoMicroBatchSizePerGPU",
        "micro-batch-divides-mini-batch",
        _set("spec.batch.ppoMicroBatchSizePerGPU", 3),
        "per-GPU mini-batch of 8 responses",
    ),
    _case(
        "r6-critic-micro-not-dividing",
        "spec.critic.ppoMicroBatchSizePerGPU",
        "critic-micro-batch-divides-mini-batch",
        _all(_set("spec.algorithm.advantageEstimator", "gae"), _set("spec.critic", {"ppoMicroBatchSizePerGPU": 3})),
        "critic.ppoMicroBatchSizePerGPU = 3",
    ),
    _case(
        "r4-micro-missing",
        "spec.batch.ppoMicroBatchSizePerGPU",
        "micro-batch-required",
        _drop("spec.batch.ppoMicroBatchSizePerGPU"),
        "required unless",
    ),
    _case(
        "r10-token-budget-too-small",
        "spec.batch.dynamicBatchSize.maxTokenLenPerGPU",
        "token-budget-fits-sequence",
        _set("spec.batch.dynamicBatchSize", {"enabled": True, "maxTokenLenPerGPU": 1000}),
        "= 1024",
    ),
    _case(
        "r11-rollout-gpus-not-divisible-by-tp",
        "spec.rollout.tensorParallelSize",
        "rollout-gpus-divisible-by-tp",
        _set("spec.rollout.tensorParallelSize", 3),
        "8 rollout GPUs are not divisible",
    ),
    _case(
        "r11-separate-pool-not-divisible",
        "spec.rollout.tensorParallelSize",
        "rollout-gpus-divisible-by-tp",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.rollout.tensorParallelSize", 4),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 2}),
        ),
        "2 rollout GPUs",
    ),
    _case(
        "r8-dual-clip-not-above-one",
        "spec.algorithm.clipRatioC",
        "dual-clip-above-one",
        _set("spec.algorithm.clipRatioC", 1.0),
        "must be greater than 1",
    ),
    _case(
        "r14-val-sampling-at-zero-temperature",
        "spec.rollout.val.temperature",
        "val-sampling-needs-temperature",
        _set("spec.rollout.val", {"doSample": True, "temperature": 0}),
        "doSample is true",
    ),
    _case(
        "r16-adaptive-kl-without-target",
        "spec.algorithm.kl",
        "adaptive-kl-needs-target",
        _set("spec.algorithm.kl", {"inReward": True, "control": "adaptive", "target": 0}),
        "target = 0",
    ),
    _case(
        "r16-adaptive-kl-without-horizon",
        "spec.algorithm.kl",
        "adaptive-kl-needs-target",
        _set("spec.algorithm.kl", {"inReward": True, "control": "adaptive", "horizon": 0}),
        "horizon = 0",
    ),
    _case(
        "grpo-needs-group",
        "spec.batch.rolloutN",
        "group-estimator-needs-group",
        _set("spec.batch.rolloutN", 1),
        "rolloutN = 1",
    ),
    _case(
        "rloo-needs-group",
        "spec.batch.rolloutN",
        "group-estimator-needs-group",
        _all(_set("spec.algorithm.advantageEstimator", "rloo"), _set("spec.batch.rolloutN", 1)),
        "rloo",
    ),
    _case(
        "group-at-zero-temperature",
        "spec.rollout.temperature",
        "group-needs-sampling",
        _set("spec.rollout.temperature", 0),
        "are identical",
    ),
    _case(
        "gae-needs-critic",
        "spec.critic",
        "gae-needs-critic",
        _set("spec.algorithm.advantageEstimator", "gae"),
        "needs a value model",
    ),
    _case(
        "separate-without-rollout-pool",
        "spec.cluster.rollout",
        "separate-placement-needs-rollout-pool",
        _set("spec.rollout.placement", "separate"),
        "cluster.rollout is missing",
    ),
    _case(
        "rollout-pool-while-colocated",
        "spec.cluster.rollout",
        "separate-placement-needs-rollout-pool",
        _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
        "rollout.placement is colocated",
    ),
    _case(
        "hf-engine-separate",
        "spec.rollout.engine",
        "engine-placement",
        _all(
            _set("spec.rollout.engine", "hf"),
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
        ),
        "cannot run separate on cluster.device cuda; engines that can: vllm",
    ),
    _case(
        "vllm-on-cpu",
        "spec.rollout.engine",
        "engine-runs-on-device",
        _set("spec.cluster.device", "cpu"),
        "does not run on cluster.device cpu; engines that do: hf",
    ),
    _case(
        "hf-tensor-parallel",
        "spec.rollout.tensorParallelSize",
        "engine-tensor-parallel",
        _all(_set("spec.rollout.engine", "hf"), _set("spec.rollout.tensorParallelSize", 2)),
        "rollout.engine hf runs one unsharded copy of the policy per engine; use 1, or an engine that shards it over "
        "GPUs: vllm",
    ),
    _case("top-k-zero", "spec.rollout.topK", "top-k-valid", _set("spec.rollout.topK", 0), "topK = 0"),
    _case(
        "lora-rank-over-vllm-limit",
        "spec.model.lora.rank",
        "lora-rank-fits-engine",
        _set("spec.model.lora", {"rank": 1024}),
        "exceeds the largest LoRA rank rollout.engine vllm takes, 512",
    ),
    _case(
        "reward-model-too-short",
        "spec.reward.model.maxLength",
        "reward-model-reads-whole-sequence",
        _set("spec.reward.model", {"path": "/models/rm", "maxLength": 512}),
        "truncated",
    ),
    _case(
        "test-freq-without-val-files",
        "spec.trainer.testFreq",
        "periodic-validation-needs-files",
        _all(_set("spec.data.valFiles", []), _set("spec.trainer.testFreq", 5)),
        "data.valFiles is empty",
    ),
    _case(
        "r19-resume-not-a-step",
        "spec.trainer.resume",
        "resume-path",
        _set("spec.trainer.resume", "/checkpoints/latest"),
        "global_step_N",
    ),
    _case(
        "volume-mount-without-volume",
        "spec.cluster.volumeMounts",
        "volume-mounts-name-volumes",
        _set("spec.cluster.volumeMounts", [{"name": "ckpt", "mountPath": "/ckpt"}]),
        "must name a volume",
    ),
    # pod settings and Kueue (issue 20)
    _case(
        "head-pod-label-reserved",
        "spec.cluster.head.pod.labels",
        "head-pod-labels-not-reserved",
        _set("spec.cluster.head.pod.labels", {"ray.io/node-type": "head"}),
        "KubeRay's",
    ),
    _case(
        "trainer-pod-label-reserved",
        "spec.cluster.trainer.pod.labels",
        "trainer-pod-labels-not-reserved",
        _set("spec.cluster.trainer.pod.labels", {"kuberl.io/pool": "x"}),
        "operator's",
    ),
    _case(
        "rollout-pod-label-reserved",
        "spec.cluster.rollout.pod.labels",
        "rollout-pod-labels-not-reserved",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "pod": {"labels": {"kuberl.io/rljob": "other"}}}),
        ),
        "choose another key",
    ),
    _case(
        "head-extra-resource-memory",
        "spec.cluster.head.pod.extraResources",
        "head-extra-resources-are-extended",
        _set("spec.cluster.head.pod.extraResources", {"memory": "1Gi"}),
        "extended resources",
    ),
    _case(
        "trainer-extra-resource-gpu",
        "spec.cluster.trainer.pod.extraResources",
        "trainer-extra-resources-are-extended",
        _set("spec.cluster.trainer.pod.extraResources", {"nvidia.com/gpu": "8"}),
        "gpusPerNode",
    ),
    _case(
        "rollout-extra-resource-cpu",
        "spec.cluster.rollout.pod.extraResources",
        "rollout-extra-resources-are-extended",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "pod": {"extraResources": {"cpu": "2"}}}),
        ),
        "domain/name",
    ),
    _case(
        "ib-hca-with-ib-disabled",
        "spec.cluster.network.ibHca",
        "ib-hca-needs-ib",
        _set("spec.cluster.network", {"ibHca": "mlx5_0", "disableIB": True}),
        "remove one of them",
    ),
    _case(
        "multikueue-without-queue",
        "spec.cluster.managedBy",
        "multikueue-needs-queue",
        _set("spec.cluster.managedBy", "kueue.x-k8s.io/multikueue"),
        "needs cluster.queueName",
    ),
    _case(
        "literal-credential-in-env",
        "spec.cluster.env",
        "no-literal-credentials",
        _set("spec.cluster.env", [{"name": "LOG", "value": "1"}, {"name": "hf_token", "value": "hf_abc"}]),
        "cluster.env hf_token looks like a credential given as a literal value: reference a Secret with valueFrom",
    ),
    _case(
        "literal-env-too-large",
        "spec.cluster.env",
        "literal-env-bounded",
        _set("spec.cluster.env", [{"name": f"V{i}", "value": "x" * 4096} for i in range(5)]),
        "literal values total 20480 characters, more than 16384",
    ),
    _case(
        "name-too-long-for-kuberay-" + "x" * 30, "metadata.name", "name-fits-kuberay", lambda doc: None, "47 characters"
    ),
    # checkpoint storage
    _case(
        "storage-claim-name-and-template",
        "spec.storage",
        "storage-one-source",
        _set("spec.storage", {"claimName": "rl-checkpoints", "claim": {"size": "1Gi"}}),
        "exclusive",
    ),
    _case(
        "storage-claim-read-write-once",
        "spec.storage.claim.accessMode",
        "claim-shared-by-pods",
        _set("spec.storage", {"claim": {"accessMode": "ReadWriteOnce"}}),
        "2 pods",
    ),
    _case(
        "checkpoint-dir-off-the-claim",
        "spec.trainer.checkpointDir",
        "checkpoint-dir-on-claim",
        _set("spec.trainer.checkpointDir", "/tmp/checkpoints"),
        "use a relative path",
    ),
    _case(
        "checkpoints-without-storage",
        "spec.trainer.checkpointDir",
        "checkpoints-survive-pods",
        _set("spec.storage", {}),
        "set storage.claim",
    ),
    _case(
        "stall-deadline-before-timeout",
        "spec.runPolicy.stallDeadlineSeconds",
        "stall-deadline-after-timeout",
        _set("spec.runPolicy", {"stallTimeoutSeconds": 600, "stallDeadlineSeconds": 300}),
        "stallDeadlineSeconds = 300 is shorter than runPolicy.stallTimeoutSeconds = 600",
    ),
    # ranges, enums, types and unknown fields (schema)
    _case(
        "gpu-memory-utilization-zero",
        "spec.rollout.gpuMemoryUtilization",
        "schema",
        _set("spec.rollout.gpuMemoryUtilization", 0),
    ),
    _case(
        "gpu-memory-utilization-above-one",
        "spec.rollout.gpuMemoryUtilization",
        "schema",
        _set("spec.rollout.gpuMemoryUtilization", 1.5),
    ),
    _case("train-batch-zero", "spec.batch.trainBatchSize", "schema", _set("spec.batch.trainBatchSize", 0)),
    _case("response-length-zero", "spec.data.maxResponseLength", "schema", _set("spec.data.maxResponseLength", 0)),
    _case(
        "unknown-estimator",
        "spec.algorithm.advantageEstimator",
        "schema",
        _set("spec.algorithm.advantageEstimator", "ppo"),
    ),
    _case("unknown-loss-agg-mode", "spec.algorithm.lossAggMode", "schema", _set("spec.algorithm.lossAggMode", "sum")),
    _case(
        "unknown-kl-type",
        "spec.algorithm.kl.loss.type",
        "schema",
        _set("spec.algorithm.kl.loss", {"enabled": True, "type": "low_var_kl"}),
    ),
    _case("gamma-above-one", "spec.algorithm.gamma", "schema", _set("spec.algorithm.gamma", 1.5)),
    _case("negative-entropy-coef", "spec.algorithm.entropyCoef", "schema", _set("spec.algorithm.entropyCoef", -0.1)),
    _case(
        "zero-trainer-gpus", "spec.cluster.trainer.gpusPerNode", "schema", _set("spec.cluster.trainer.gpusPerNode", 0)
    ),
    _case(
        "too-many-train-files",
        "spec.data.trainFiles",
        "schema",
        _set("spec.data.trainFiles", [f"/data/{i}.parquet" for i in range(65)]),
    ),
    _case("no-train-files", "spec.data.trainFiles", "schema", _set("spec.data.trainFiles", [])),
    _case("model-path-missing", "spec.model.path", "schema", _set("spec.model", {"dtype": "bfloat16"})),
    _case(
        "memory-not-a-quantity", "spec.cluster.trainer.memory", "schema", _set("spec.cluster.trainer.memory", "lots")
    ),
    _case(
        "batch-size-not-a-number",
        "spec.batch.trainBatchSize",
        "schema",
        _set("spec.batch.trainBatchSize", "sixty-four"),
    ),
    _case(
        "typo-in-batch-field",
        "spec.batch.rolloutNum",
        "schema",
        _set("spec.batch.rolloutNum", 8),
        "did you mean 'rolloutN'",
    ),
    _case("typo-in-spec-section", "spec.algorythm", "schema", _set("spec.algorythm", {}), "did you mean 'algorithm'"),
    # --- policy losses, estimators and DAPO (issue 18) ---
    _case(
        "passk-needs-group",
        "spec.batch.rolloutN",
        "group-baseline-needs-group",
        _all(_set("spec.algorithm.advantageEstimator", "grpo_passk"), _set("spec.batch.rolloutN", 1)),
        "grpo_passk takes its baseline",
    ),
    _case(
        "opo-needs-group",
        "spec.batch.rolloutN",
        "group-baseline-needs-group",
        _all(_set("spec.algorithm.advantageEstimator", "opo"), _set("spec.batch.rolloutN", 1)),
        "rolloutN = 1",
    ),
    _case(
        "filter-groups-needs-group",
        "spec.algorithm.filterGroups.enabled",
        "filter-groups-needs-group",
        _all(
            _set("spec.algorithm.advantageEstimator", "remax"),
            _set("spec.batch.rolloutN", 1),
            _set("spec.algorithm.filterGroups", {"enabled": True}),
        ),
        "rolloutN = 1",
    ),
    _case(
        "filter-groups-extra-metric-with-reward-model",
        "spec.algorithm.filterGroups.metric",
        "filter-groups-metric-available",
        _all(
            _set("spec.algorithm.filterGroups", {"enabled": True, "metric": "acc"}),
            _set("spec.reward.model", {"path": "/models/rm", "maxLength": 4096}),
        ),
        "metric acc",
    ),
    _case(
        "filter-groups-zero-rounds",
        "spec.algorithm.filterGroups.maxNumGenBatches",
        "schema",
        _set("spec.algorithm.filterGroups", {"enabled": True, "maxNumGenBatches": 0}),
    ),
    _case(
        "filter-groups-metric-not-a-name",
        "spec.algorithm.filterGroups.metric",
        "schema",
        _set("spec.algorithm.filterGroups", {"enabled": True, "metric": "acc; drop"}),
    ),
    _case(
        "overlong-buffer-fills-response",
        "spec.reward.overlongBuffer.length",
        "overlong-buffer-within-response",
        _set("spec.reward.overlongBuffer", {"length": 512}),
        "data.maxResponseLength = 512",
    ),
    _case(
        "overlong-buffer-negative-penalty",
        "spec.reward.overlongBuffer.penaltyFactor",
        "schema",
        _set("spec.reward.overlongBuffer", {"length": 64, "penaltyFactor": -1}),
    ),
    _case(
        "clip-cov-bounds-reversed",
        "spec.algorithm.policyLoss.clipCovLb",
        "clip-cov-bounds-ordered",
        _set("spec.algorithm.policyLoss", {"lossMode": "clip_cov", "clipCovLb": 5.0, "clipCovUb": 1.0}),
        "clipCovLb = 5",
    ),
    _case(
        "rollout-correction-without-rollout-log-probs",
        "spec.algorithm.rolloutCorrection.enabled",
        "rollout-correction-needs-rollout-log-probs",
        _set("spec.algorithm.rolloutCorrection", {"enabled": True}),
        "rollout.calculateLogProbs is false",
    ),
    _case(
        "rollout-correction-with-geo-mean",
        "spec.algorithm.rolloutCorrection.enabled",
        "rollout-correction-token-loss",
        _all(
            _set("spec.rollout.calculateLogProbs", True),
            _set("spec.algorithm.rolloutCorrection", {"enabled": True}),
            _set("spec.algorithm.policyLoss", {"lossMode": "geo_mean"}),
        ),
        "lossMode geo_mean",
    ),
    _case(
        "overlap-colocated",
        "spec.rollout.overlap",
        "overlap-needs-separate-placement",
        _set("spec.rollout.overlap", "oneStepOffPolicy"),
        "sleeps while training runs",
    ),
    _case(
        "overlap-with-dynamic-sampling",
        "spec.rollout.overlap",
        "overlap-without-dynamic-sampling",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "oneStepOffPolicy"),
            _set("spec.algorithm.filterGroups", {"enabled": True}),
        ),
        "not supported with algorithm.filterGroups",
    ),
    _case(
        "overlap-with-agent",
        "spec.rollout.overlap",
        "overlap-without-agent",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "oneStepOffPolicy"),
            _set("spec.rollout.agent", {"tools": [{"name": "calculator"}]}),
        ),
        "not supported with rollout.agent",
    ),
    _case(
        "unknown-overlap",
        "spec.rollout.overlap",
        "schema",
        _set("spec.rollout.overlap", "twoStepOffPolicy"),
    ),
    # --- asynchronous training and the elastic rollout pool (issue 36) ---
    _case(
        "async-colocated",
        "spec.rollout.overlap",
        "overlap-needs-separate-placement",
        _set("spec.rollout.overlap", "async"),
        "rollout.overlap async generates",
    ),
    _case(
        "async-with-dynamic-sampling",
        "spec.rollout.overlap",
        "overlap-without-dynamic-sampling",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 2, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "async"),
            _set("spec.algorithm.filterGroups", {"enabled": True}),
        ),
        "rollout.overlap async is not supported with algorithm.filterGroups",
    ),
    _case(
        "async-with-agent",
        "spec.rollout.overlap",
        "overlap-without-agent",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 2, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "async"),
            _set("spec.rollout.agent", {"tools": [{"name": "calculator"}]}),
        ),
        "rollout.overlap async is not supported with rollout.agent",
    ),
    _case(
        "max-staleness-one-step-off",
        "spec.rollout.maxStaleness",
        "max-staleness-needs-async",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "oneStepOffPolicy"),
            _set("spec.rollout.maxStaleness", 2),
        ),
        "rollout.maxStaleness = 2 bounds the staleness of rollout.overlap async, but rollout.overlap is "
        "oneStepOffPolicy, whose staleness is fixed (exactly 1)",
    ),
    _case(
        "max-staleness-synchronous",
        "spec.rollout.maxStaleness",
        "max-staleness-needs-async",
        _set("spec.rollout.maxStaleness", 1),
        "rollout.overlap is none, whose staleness is fixed (0); set rollout.overlap async or remove",
    ),
    _case(
        "max-staleness-zero",
        "spec.rollout.maxStaleness",
        "schema",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "async"),
            _set("spec.rollout.maxStaleness", 0),
        ),
    ),
    _case(
        "max-staleness-unbounded",
        "spec.rollout.maxStaleness",
        "schema",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "async"),
            _set("spec.rollout.maxStaleness", 65),
        ),
    ),
    _case(
        "partial-rollouts-one-step-off",
        "spec.rollout.partialRollouts",
        "partial-rollouts-need-async",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "oneStepOffPolicy"),
            _set("spec.rollout.partialRollouts", True),
        ),
        "with rollout.overlap oneStepOffPolicy no generation is in flight while the weights change",
    ),
    _case(
        "partial-rollouts-synchronous",
        "spec.rollout.partialRollouts",
        "partial-rollouts-need-async",
        _set("spec.rollout.partialRollouts", True),
        "set rollout.overlap async or rollout.partialRollouts false",
    ),
    _case(
        "async-remax",
        "spec.rollout.overlap",
        "async-without-remax",
        _all(
            _set("spec.rollout.placement", "separate"),
            _set("spec.cluster.rollout", {"nodes": 1, "gpusPerNode": 8}),
            _set("spec.rollout.overlap", "async"),
            _set("spec.algorithm.advantageEstimator", "remax"),
        ),
        "algorithm.advantageEstimator remax needs each group's greedy baseline generated with the same weights",
    ),
    _case(
        "empty-rollout-pool-timeout-zero",
        "spec.runPolicy.emptyRolloutPoolTimeoutSeconds",
        "schema",
        _set("spec.runPolicy.emptyRolloutPoolTimeoutSeconds", 0),
    ),
    _case(
        "rollout-correction-threshold-one",
        "spec.algorithm.rolloutCorrection.threshold",
        "schema",
        _set("spec.algorithm.rolloutCorrection", {"enabled": True, "threshold": 1.0}),
    ),
    _case(
        "unknown-policy-loss",
        "spec.algorithm.policyLoss.lossMode",
        "schema",
        _set("spec.algorithm.policyLoss", {"lossMode": "ppo"}),
    ),
    _case(
        "kl-cov-ratio-zero",
        "spec.algorithm.policyLoss.klCovRatio",
        "schema",
        _set("spec.algorithm.policyLoss", {"lossMode": "kl_cov", "klCovRatio": 0}),
    ),
    # --- multi-turn agent rollouts (issue 21) ---
    _case(
        "agent-without-tools",
        "spec.rollout.agent",
        "agent-tools-or-environment",
        _set("spec.rollout.agent", {"maxTurns": 3}),
        "0 tool(s) and no environment",
    ),
    _case(
        "agent-tools-and-environment",
        "spec.rollout.agent",
        "agent-tools-or-environment",
        _set("spec.rollout.agent", {"tools": [{"name": "calculator"}], "environment": {"class": "envs:Maze"}}),
        "1 tool(s) and an environment",
    ),
    _case(
        "agent-tool-twice",
        "spec.rollout.agent.tools",
        "agent-tool-names-unique",
        _set("spec.rollout.agent", {"tools": [{"name": "calculator"}, {"name": "calculator"}]}),
        "twice (calculator)",
    ),
    _case(
        "agent-tool-unknown-builtin",
        "spec.rollout.agent.tools",
        "agent-tool-function-resolvable",
        _set("spec.rollout.agent", {"tools": [{"name": "search"}]}),
        "rollout.agent.tools search",
    ),
    _case(
        "agent-tool-function-not-a-path",
        "spec.rollout.agent.tools[0].function",
        "schema",
        _set("spec.rollout.agent", {"tools": [{"name": "lookup", "function": "tools.lookup"}]}),
    ),
    _case(
        "agent-max-turns-zero",
        "spec.rollout.agent.maxTurns",
        "schema",
        _set("spec.rollout.agent", {"tools": [{"name": "calculator"}], "maxTurns": 0}),
    ),
]

INVALID_CASES += [
    _case(
        "model-path-bare-hub-id",
        "spec.model.path",
        "model-path-source",
        _set("spec.model.path", "Qwen/Qwen2.5-7B-Instruct"),
        "write hf://Qwen/Qwen2.5-7B-Instruct",
    ),
    _case("model-path-http", "spec.model.path", "model-path-source", _set("spec.model.path", "https://x.org/m")),
    _case("model-path-gs", "spec.model.path", "model-path-source", _set("spec.model.path", "gs://bucket/model")),
    _case("model-path-hf-no-name", "spec.model.path", "model-path-source", _set("spec.model.path", "hf://Qwen")),
    _case(
        "tokenizer-path-bare-hub-id",
        "spec.model.tokenizerPath",
        "model-tokenizerpath-source",
        _set("spec.model.tokenizerPath", "Qwen/Qwen2.5-7B-Instruct"),
    ),
    _case(
        "critic-model-path-http",
        "spec.critic.modelPath",
        "critic-modelpath-source",
        _set("spec.critic", {"modelPath": "http://host/critic"}),
    ),
    _case(
        "reward-model-path-gs",
        "spec.reward.model.path",
        "reward-model-path-source",
        _set("spec.reward.model", {"path": "gs://bucket/rm"}),
    ),
    _case(
        "mlflow-logger-without-a-server",
        "spec.trainer.tracking",
        "mlflow-needs-a-server",
        lambda doc: doc["spec"].setdefault("trainer", {}).update(loggers=["console", "mlflow"]),
        "trainer.tracking.mlflowTrackingURI is not set",
    ),
    _case(
        "mlflow-tracking-uri-not-http",
        "spec.trainer.tracking.mlflowTrackingURI",
        "schema",
        lambda doc: doc["spec"].setdefault("trainer", {}).update(tracking={"mlflowTrackingURI": "mlflow:5000"}),
    ),
    _case(
        "reward-on-error-zero-with-model",
        "spec.reward.onError",
        "reward-on-error-needs-function",
        lambda doc: doc["spec"].update(reward={"onError": "zero", "model": {"path": "/models/rm", "maxLength": 4096}}),
        "reward.onError zero",
    ),
    _case(
        "reward-sandbox-with-model",
        "spec.reward.sandbox",
        "reward-sandbox-needs-function",
        lambda doc: doc["spec"].update(reward={"sandbox": {}, "model": {"path": "/models/rm", "maxLength": 4096}}),
        "reward.sandbox runs",
    ),
    _case(
        "code-tests-without-sandbox",
        "spec.reward.sandbox",
        "sandboxed-reward-needs-pool",
        _set("spec.reward", {"function": "code_tests_all_pass"}),
        "reward.function code_tests_all_pass runs the responses' programs",
    ),
    _case(
        "python-tool-without-sandbox",
        "spec.rollout.agent.sandbox",
        "sandboxed-tool-needs-pool",
        _set("spec.rollout.agent", {"tools": [{"name": "calculator"}, {"name": "run", "function": "python"}]}),
        "rollout.agent.tools run runs the policy's programs",
    ),
    _case(
        "sandbox-network-egress",
        "spec.reward.sandbox.network",
        "schema",
        _set("spec.reward.sandbox", {"network": "egress"}),
    ),
    _case(
        "sandbox-language-unsupported",
        "spec.reward.sandbox.languages[0]",
        "schema",
        _set("spec.reward.sandbox", {"languages": ["cpp"]}),
    ),
    _case(
        "sandbox-memory-below-interpreter",
        "spec.rollout.agent.sandbox.execution.memoryMb",
        "schema",
        _set("spec.rollout.agent", {"tools": [{"name": "calculator"}], "sandbox": {"execution": {"memoryMb": 16}}}),
    ),
    _case(
        "reward-timeout-zero",
        "spec.reward.timeoutSeconds",
        "schema",
        _set("spec.reward.timeoutSeconds", 0),
    ),
    _case(
        "reward-on-error-unknown",
        "spec.reward.onError",
        "schema",
        _set("spec.reward.onError", "skip"),
    ),
    _case(
        "reward-error-fraction-above-one",
        "spec.reward.maxErrorFraction",
        "schema",
        _set("spec.reward.maxErrorFraction", 1.5),
    ),
    _case(
        "skipped-steps-zero",
        "spec.trainer.maxConsecutiveSkippedSteps",
        "schema",
        _set("spec.trainer.maxConsecutiveSkippedSteps", 0),
    ),
    _case(
        "train-file-gs",
        "spec.data.trainFiles",
        "data-trainfiles-source",
        _set("spec.data.trainFiles", ["/data/a.parquet", "gs://bucket/b.parquet"]),
        "entry gs://bucket/b.parquet",
    ),
    _case(
        "val-file-hf-model-repo",
        "spec.data.valFiles",
        "data-valfiles-source",
        _set("spec.data.valFiles", ["hf://openai/gsm8k/test.parquet"]),
    ),
]

UNKNOWN_FIELD_CASES = [c for c in INVALID_CASES if "did you mean" in c.message]
"""Pruned silently by the apiserver unless the client asks for strict field validation."""
