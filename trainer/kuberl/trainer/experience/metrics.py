"""The metrics of one training step, as verl names them: pure functions of the step's experience and timings (the
driver's loop only collects them)."""

from __future__ import annotations

from torch import Tensor

from kuberl.trainer.algorithms.losses import masked_mean, rollout_is_metrics
from kuberl.trainer.experience.batch import Experience
from kuberl.trainer.observe.metrics import Timer


def data_metrics(
    exp: Experience,
    *,
    max_response_length: int,
    kl_coef: float | None,
    rollout_is_threshold: float | None = None,
) -> dict[str, float]:
    """verl's data metrics of one step: scores, rewards, advantages, returns, values, lengths, rollout numerics.
    ``kl_coef``: the KL coefficient in use (loss or reward), None without KL. ``rollout_is_threshold``: the cap of
    the rollout importance weights (``algorithm.rolloutCorrection``), None when the correction is off."""
    scores, entropy = exp.scores, exp.entropy
    mask = exp.response_mask.float()
    resp_len = mask.sum(-1)
    prompt_len = exp.prompt_mask.float().sum(-1)
    seq_rewards = (exp.token_rewards * mask).sum(-1)
    m = {
        "critic/score/mean": scores.mean().item(),
        "critic/score/max": scores.max().item(),
        "critic/score/min": scores.min().item(),
        "critic/rewards/mean": seq_rewards.mean().item(),
        "critic/rewards/max": seq_rewards.max().item(),
        "critic/rewards/min": seq_rewards.min().item(),
        "critic/advantages/mean": masked_mean(exp.advantages, mask).item(),
        "critic/advantages/max": exp.advantages[mask.bool()].max().item(),
        "critic/advantages/min": exp.advantages[mask.bool()].min().item(),
        "critic/returns/mean": masked_mean(exp.returns, mask).item(),
        "response_length/mean": resp_len.mean().item(),
        "response_length/max": resp_len.max().item(),
        "response_length/min": resp_len.min().item(),
        "response_length/clip_ratio": (resp_len >= max_response_length).float().mean().item(),
        "prompt_length/mean": prompt_len.mean().item(),
        "prompt_length/max": prompt_len.max().item(),
        "prompt_length/min": prompt_len.min().item(),
    }
    if entropy is not None:
        m["actor/entropy"] = masked_mean(entropy, mask).item()
    if exp.values is not None:
        values, returns = exp.values, exp.returns
        m["critic/values/mean"] = masked_mean(values, mask).item()
        var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
        diff = returns - values
        var_diff = masked_mean((diff - masked_mean(diff, mask)) ** 2, mask)
        m["critic/vf_explained_var"] = (1 - var_diff / (var_returns + 1e-8)).item()
    if exp.rollout_log_probs is not None:  # verl's check of rollout vs. trainer numerics (should stay < 0.005)
        assert exp.old_log_probs is not None, "read back from the update when not computed before it"
        diff = (exp.old_log_probs.exp() - exp.rollout_log_probs.exp()).abs()
        m["training/rollout_probs_diff_mean"] = masked_mean(diff, mask).item()
        m["training/rollout_probs_diff_max"] = diff[mask.bool()].max().item()
        if rollout_is_threshold is not None:  # the weights the update applied: the same old and rollout log-probs
            m.update(rollout_is_metrics(exp.old_log_probs, exp.rollout_log_probs, mask, rollout_is_threshold))
    if kl_coef is not None:
        m["actor/kl_coef"] = kl_coef
    return m


def perf_metrics(
    tokens: float,
    timer: Timer,
    *,
    ranks: int,
    flops_per_token: float,
    ppo_epochs: int,
    peak_flops: float | None,
    device_stats: list[dict[str, float]] | None,
) -> dict[str, float]:
    """Throughput, MFU of the actor update (when ``peak_flops`` is known) and per-GPU memory and utilisation."""
    import psutil

    step_time = timer.seconds["step"]
    m = {
        "perf/total_num_tokens": tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": tokens / (step_time * ranks),
        "perf/cpu_memory_used_gb": psutil.virtual_memory().used / 2**30,
    }
    update_time = timer.seconds.get("update_actor")
    if peak_flops and update_time:
        flops = flops_per_token * tokens * ppo_epochs
        m["perf/mfu/actor"] = flops / (update_time * peak_flops * ranks)
    if device_stats is not None:
        stats = device_stats
        if stats and "max_memory_allocated_gb" in stats[0]:
            m["perf/max_memory_allocated_gb"] = max(s["max_memory_allocated_gb"] for s in stats)
            m["perf/max_memory_reserved_gb"] = max(s["max_memory_reserved_gb"] for s in stats)
            m["perf/alloc_retries"] = max(s["alloc_retries"] for s in stats)
            m["perf/max_inactive_split_gb"] = max(s["max_inactive_split_gb"] for s in stats)
        if stats and "engine_pool_gb" in stats[0]:  # a colocated engine's, included in the two peaks above
            m["perf/engine_pool_gb"] = max(s["engine_pool_gb"] for s in stats)
        if stats and "memory_used_peak_gb" in stats[0]:
            m["perf/max_memory_used_gb"] = max(s["memory_used_peak_gb"] for s in stats)
        for rank, s in enumerate(stats):
            for key in ("utilization", "memory_used_gb"):
                if key in s:
                    m[f"gpu/{rank}/{key}"] = s[key]
    return m


def staleness_metrics(weight_version: Tensor | None, *, policy_version: int) -> dict[str, float]:
    """How far behind the policy that trains on the rows their generating weights are: ``rollout/staleness`` is
    ``policy_version`` (the step whose weights the update starts from) less the oldest ``weight_version`` the
    engines stamped on the rows; 0 synchronous, 1 one-step-off-policy, at most ``rollout.maxStaleness`` async,
    where ``rollout/staleness/{min,mean,max}`` describe the rows' spread. Empty for rows without stamps (the agent
    loop's)."""
    if weight_version is None:
        return {}
    oldest = int(weight_version.min())
    per_row = (policy_version - weight_version).float()
    return {
        "rollout/weight_version": float(oldest),
        "rollout/staleness": float(policy_version - oldest),
        "rollout/staleness/min": float(per_row.min()),
        "rollout/staleness/mean": float(per_row.mean()),
        "rollout/staleness/max": float(per_row.max()),
    }
