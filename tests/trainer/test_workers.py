"""Worker groups on a local Ray: loss normalisation is invariant to ranks and micro-batching, log-probs agree
with the rollout's, and weight sync reaches the rollout."""

from pathlib import Path

import pytest
import torch

from kuberl.api import parse_spec
from kuberl.api.spec import LoRA
from kuberl.trainer.model.microbatch import shard_mini_batches

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny://llama?hidden=32&layers=2&heads=2&kv_heads=1&seed=1"


def spec_for(dp: int, **batch) -> object:
    return parse_spec(
        {
            "model": {"path": TINY, "dtype": "float32", "gradientCheckpointing": False},
            "algorithm": {"advantageEstimator": "grpo"},
            "data": {
                "trainFiles": [str(REPO / "examples/data/digits-train.parquet")],
                "maxPromptLength": 16,
                "maxResponseLength": 6,
            },
            "batch": {"trainBatchSize": 4, "rolloutN": 2, "ppoMiniBatchSize": 4, "ppoMicroBatchSizePerGPU": 1, **batch},
            "rollout": {"engine": "hf", "calculateLogProbs": True},
            "actor": {"optim": {"lr": 1e-2, "weightDecay": 0.0}},
            "trainer": {"metricsPort": 0},
            "cluster": {"device": "cpu", "trainer": {"nodes": 1, "gpusPerNode": dp}},
        }
    )


class Group:
    def __init__(self, spec) -> None:
        import ray
        from ray.util.placement_group import placement_group

        from kuberl.trainer.plan.execution import plan_execution
        from kuberl.trainer.rollout.registry import engine
        from kuberl.trainer.workers.actor import ActorWorker
        from kuberl.trainer.workers.group import WorkerGroup

        dp = spec.cluster.trainer.gpus_per_node
        self.pg = placement_group([{"CPU": 1.0}] * dp)
        ray.get(self.pg.ready())
        self.group = WorkerGroup(
            ActorWorker, role="actor", spec=spec, plan=plan_execution(spec), placement_group=self.pg
        )
        self.info = self.group.call("init_model", 10, engine(spec.rollout.engine))[0]

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        self.group.kill()
        remove_placement_group(self.pg)


def fixed_rows() -> dict[str, torch.Tensor]:
    """8 responses with different prompt and response lengths, old log-probs, advantages."""
    gen = torch.Generator().manual_seed(0)
    n, p, r = 8, 7, 6
    prompt_lens = [7, 3, 5, 2, 6, 4, 7, 1]
    response_lens = [6, 2, 4, 1, 3, 6, 5, 2]
    rows = {
        "prompts": torch.zeros(n, p, dtype=torch.long),
        "prompt_mask": torch.zeros(n, p, dtype=torch.long),
        "responses": torch.zeros(n, r, dtype=torch.long),
        "response_mask": torch.zeros(n, r, dtype=torch.long),
    }
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        rows["prompts"][i, p - pl :] = torch.randint(4, 100, (pl,), generator=gen)
        rows["prompt_mask"][i, p - pl :] = 1
        rows["responses"][i, :rl] = torch.randint(4, 100, (rl,), generator=gen)
        rows["response_mask"][i, :rl] = 1
    rows["advantages"] = torch.randn(n, 1, generator=gen).expand(n, r) * rows["response_mask"]
    return rows


def train(spec, steps: int = 1) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``steps`` actor updates on fixed_rows, split as the driver splits them, against the old log-probs of the
    initial model (so that the ratio, the clipping and the loss move from step to step); the full weights afterwards
    and the loss of every step."""
    from kuberl.trainer.workers.base import reduce_update_metrics

    group = Group(spec)
    try:
        dp = len(group.group)
        rows = fixed_rows()
        keys = ("prompts", "prompt_mask", "responses", "response_mask")
        per = len(rows["responses"]) // dp
        shards = [{k: rows[k][i * per : (i + 1) * per] for k in keys} for i in range(dp)]
        totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": 8.0}]
        old = group.group.each("compute_log_probs", [(s,) for s in shards])
        rows["old_log_probs"] = torch.cat([o["log_probs"] for o in old])
        losses = []
        for _ in range(steps):
            mine = shard_mini_batches(rows, mini_batch_rows=8, dp=dp)
            results = group.group.each("update", [(m, totals) for m in mine])
            losses.append(reduce_update_metrics(results, "actor")["actor/pg_loss"])
        weights = group.group.call("full_weights")
        for other in weights[1:]:  # every rank gathers the same full weights
            assert all(torch.equal(other[k], weights[0][k]) for k in weights[0])
        return weights[0], losses
    finally:
        group.close()


@pytest.mark.timeout(300)
def test_one_update_gives_the_same_weights_for_any_rank_count_and_micro_batching(local_ray):
    reference, _ = train(spec_for(1, ppoMiniBatchSize=4, ppoMicroBatchSizePerGPU=8))
    variants = {
        "1 rank, micro 1": spec_for(1, ppoMicroBatchSizePerGPU=1),
        "2 ranks, micro 2": spec_for(2, ppoMicroBatchSizePerGPU=2),
        "2 ranks, dynamic": spec_for(2, dynamicBatchSize={"enabled": True, "maxTokenLenPerGPU": 24}),
    }
    for label, spec in variants.items():
        weights, _ = train(spec)
        for name, tensor in reference.items():
            torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-5, msg=f"{label}: {name}")


@pytest.mark.timeout(300)
def test_a_fixed_global_batch_gives_the_same_loss_curve_on_one_and_two_ranks(local_ray):
    """Issue 9's check on gloo: six optimizer steps (the Adam moments and the schedule carry over) on 1 and 2 ranks."""
    one_weights, one = train(spec_for(1, ppoMicroBatchSizePerGPU=2), steps=6)
    two_weights, two = train(spec_for(2, ppoMicroBatchSizePerGPU=2), steps=6)
    assert len(set(round(loss, 4) for loss in one)) > 1, f"the loss did not move: {one}"
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one), rtol=1e-4, atol=1e-6)
    for name, tensor in one_weights.items():
        torch.testing.assert_close(two_weights[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.timeout(300)
def test_training_log_probs_match_the_rollout_after_a_weight_sync(local_ray):
    group = Group(spec_for(2))
    try:
        prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]]
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 6}
        rows_before = group.group.each("generate", [(prompts[:2], 2, sampling), (prompts[2:], 2, sampling)])
        # an update changes the weights; sync them and generate again
        rows = rows_before[0]
        rows["old_log_probs"] = group.group.each("compute_log_probs", [(rows,), (rows,)])[0]["log_probs"]
        rows["advantages"] = torch.ones_like(rows["old_log_probs"]) * rows["response_mask"]
        totals = [{"tokens": float(rows["response_mask"].sum()) * 2, "seqs": 8.0}]
        keys = ("prompts", "prompt_mask", "responses", "response_mask", "old_log_probs", "advantages")
        mb = {k: rows[k] for k in keys}
        group.group.each("update", [([mb], totals), ([mb], totals)])
        group.group.call("sync_weights", 1)
        fresh = group.group.each("generate", [(prompts[:2], 2, sampling), (prompts[2:], 2, sampling)])
        for batch in fresh:
            recomputed = group.group.each("compute_log_probs", [(batch,), (batch,)])[0]["log_probs"]
            mask = batch["response_mask"].bool()
            torch.testing.assert_close(recomputed[mask], batch["rollout_log_probs"][mask], rtol=1e-4, atol=1e-4)
        stale = group.group.each("compute_log_probs", [(rows_before[1],), (rows_before[1],)])[0]["log_probs"]
        mask = rows_before[1]["response_mask"].bool()
        assert not torch.allclose(stale[mask], rows_before[1]["rollout_log_probs"][mask], atol=1e-4)
    finally:
        group.close()


@pytest.mark.timeout(300)
def test_lora_reference_is_the_base_model_and_the_rollout_gets_merged_weights(local_ray):
    spec = spec_for(2)
    spec.model.lora = LoRA(rank=4, alpha=8)
    spec.algorithm.kl.loss.enabled = True
    group = Group(spec)
    try:
        rows = fixed_rows()
        keys = ("prompts", "prompt_mask", "responses", "response_mask")
        shards = [{k: rows[k][i * 4 : (i + 1) * 4] for k in keys} for i in range(2)]
        policy = torch.cat([o["log_probs"] for o in group.group.each("compute_log_probs", [(s,) for s in shards])])
        ref = torch.cat([o["ref_log_probs"] for o in group.group.each("compute_ref_log_probs", [(s,) for s in shards])])
        torch.testing.assert_close(policy, ref)  # lora_B starts at zero: the adapter is a no-op
        base = group.group.call("full_weights")[0]
        assert not any("lora" in name or "base_layer" in name for name in base)
        rows["old_log_probs"] = policy
        rows["ref_log_probs"] = ref
        totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": 8.0}]
        group.group.each("update", [(m, totals) for m in shard_mini_batches(rows, mini_batch_rows=8, dp=2)])
        after = torch.cat([o["log_probs"] for o in group.group.each("compute_log_probs", [(s,) for s in shards])])
        ref_after = torch.cat(
            [o["ref_log_probs"] for o in group.group.each("compute_ref_log_probs", [(s,) for s in shards])]
        )
        torch.testing.assert_close(ref_after, ref)  # the base weights are frozen
        assert not torch.allclose(after, policy)
        merged = group.group.call("full_weights")[0]
        changed = [n for n in merged if not torch.equal(merged[n], base[n])]
        assert changed and all("proj" in n for n in changed)  # only adapted linear layers moved
    finally:
        group.close()


@pytest.mark.timeout(300)
def test_an_update_without_old_log_probs_takes_them_from_its_own_forward(local_ray):
    """One mini-batch, one epoch (ExecutionPlan.old_log_probs_from_update): the update's forward gives the old
    log-probs and entropy a separate pass gives, and the same weights."""
    rows = fixed_rows()
    keys = ("prompts", "prompt_mask", "responses", "response_mask")
    shards = [{k: rows[k][i * 4 : (i + 1) * 4] for k in keys} for i in range(2)]
    totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": 8.0}]
    spec = spec_for(2, ppoMicroBatchSizePerGPU=2)
    spec.algorithm.entropy_coef = 0.01
    results = {}
    for fused in (False, True):
        group = Group(spec)
        try:
            given = dict(rows)
            old = group.group.each("compute_log_probs", [(s,) for s in shards])
            if not fused:
                given["old_log_probs"] = torch.cat([o["log_probs"] for o in old])
            group.group.each("update", [(m, totals) for m in shard_mini_batches(given, mini_batch_rows=8, dp=2)])
            outputs = group.group.call("update_outputs")
            results[fused] = (old, outputs, group.group.call("full_weights")[0])
        finally:
            group.close()
    old, outputs, weights = results[True]
    assert results[False][1] == [{}, {}]  # given old log-probs: nothing to read back
    mask = rows["response_mask"].bool()
    for key in ("log_probs", "entropy"):
        separate = torch.cat([o[key] for o in old])
        from_update = torch.cat([o[key] for o in outputs])
        torch.testing.assert_close(from_update[mask], separate[mask], rtol=0, atol=1e-5, msg=key)
        assert (from_update[~mask] == 0).all()
    for name, tensor in results[False][2].items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.timeout(300)
def test_the_rollout_correction_weighs_each_tokens_loss_in_the_update(local_ray):
    """Rollout log-probs that put π_old/π_rollout at 2 on even response positions and 0.5 on odd ones give weights
    1.5 (capped) and 0.5; vanilla PPO's token loss is positively homogeneous in A, so the corrected update equals an
    uncorrected one on advantages A·w: the same loss and the same weights after the step. Ignoring the weights (or
    weighting the wrong tokens) changes the gradient's direction and fails the comparison."""
    import math

    from kuberl.trainer.workers.base import reduce_update_metrics

    rows = fixed_rows()
    keys = ("prompts", "prompt_mask", "responses", "response_mask")
    shards = [{k: rows[k][i * 4 : (i + 1) * 4] for k in keys} for i in range(2)]
    totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": 8.0}]
    even = (torch.arange(rows["responses"].shape[1]) % 2 == 0).expand_as(rows["advantages"])
    results = {}
    for corrected in (True, False):
        spec = spec_for(2, ppoMicroBatchSizePerGPU=2)
        spec.algorithm.rollout_correction.enabled = corrected
        spec.algorithm.rollout_correction.threshold = 1.5
        group = Group(spec)
        try:
            given = dict(rows)
            old = torch.cat([o["log_probs"] for o in group.group.each("compute_log_probs", [(s,) for s in shards])])
            given["old_log_probs"] = old
            if corrected:
                given["rollout_log_probs"] = torch.where(even, old - math.log(2.0), old + math.log(2.0))
            else:
                given["advantages"] = rows["advantages"] * torch.where(even, 1.5, 0.5)
            mine = shard_mini_batches(given, mini_batch_rows=8, dp=2)
            metrics = reduce_update_metrics(group.group.each("update", [(m, totals) for m in mine]), "actor")
            results[corrected] = (metrics["actor/pg_loss"], group.group.call("full_weights")[0])
        finally:
            group.close()
    assert results[True][0] != 0.0
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5, abs=1e-7)
    for name, tensor in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.timeout(300)
def test_non_finite_steps_are_skipped_counted_and_fail_after_the_limit_in_a_row(local_ray):
    """NaN advantages (a reward that was inf before the finiteness check) make the gradient norm NaN: the step is
    skipped and counted, a finite step resets the run, and maxConsecutiveSkippedSteps in a row fail the update."""
    import ray

    from kuberl.trainer.workers.base import reduce_update_metrics

    spec = spec_for(1, ppoMicroBatchSizePerGPU=8)
    spec.trainer.max_consecutive_skipped_steps = 2
    rows = fixed_rows()
    poisoned = dict(rows, advantages=rows["advantages"].clone())
    poisoned["advantages"][0, 0] = float("nan")
    totals = [{"tokens": float(rows["response_mask"].sum()), "seqs": 8.0}]
    group = Group(spec)
    try:
        keys = ("prompts", "prompt_mask", "responses", "response_mask")
        old = group.group.each("compute_log_probs", [({k: rows[k] for k in keys},)])[0]["log_probs"]

        def update(given: dict[str, torch.Tensor]) -> dict[str, float]:
            mine = shard_mini_batches(dict(given, old_log_probs=old), mini_batch_rows=8, dp=1)
            return reduce_update_metrics(group.group.each("update", [(m, totals) for m in mine]), "actor")

        before = group.group.call("full_weights")[0]
        assert update(poisoned)["actor/skipped_steps"] == 1.0
        after = group.group.call("full_weights")[0]
        assert all(torch.equal(after[k], before[k]) for k in before), "a skipped step changed the weights"
        assert update(rows)["actor/skipped_steps"] == 0.0
        assert update(poisoned)["actor/skipped_steps"] == 1.0
        with pytest.raises(ray.exceptions.RayTaskError, match=r"2 optimizer steps in a row had a non-finite") as e:
            update(poisoned)
        assert "NonFiniteStepsError" in str(e.value) and "maxConsecutiveSkippedSteps = 2" in str(e.value)
    finally:
        group.close()
