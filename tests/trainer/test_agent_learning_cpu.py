"""The learning check of the agent loop on CPU: `kuberl run` on examples/agent-calculator-cpu.yaml, a tiny policy
that can copy but not multiply, raises its calculator call rate and its reward within the step budget below.

The policy (examples/models/agent-calculator-warm) is the example's tiny llama after the supervised warm-up of
``kuberl.trainer.warmup`` on ``kuberl data arithmetic --layout short`` rows, 30% of the demonstrations calling the
calculator and the rest answering the product directly (how it was made: the example's header). It copies the
expression into the call and the tool's output into its answer, and cannot multiply, so at the start only its
calling trajectories are rewarded; GRPO must move its first-token choice towards the call. Everything else is the
real path: local Ray, the tool workers, the masks, the reward function, the update.
"""

from pathlib import Path

import pytest

from tests.trainer.kuberl_cli import example_run, window_means

STEPS = 16
"""The step budget: the example's 16 GRPO steps of 8 prompts × 4 samples."""
WINDOW = 4
"""Means over the first and the last 4 steps."""
RATE_GAIN = 0.25
REWARD_GAIN = 0.25
"""Required rise of ``agent/tool_call_rate`` and ``critic/score/mean`` from the first window to the last."""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rl_raises_the_call_rate_and_the_reward_of_a_warmed_tiny_policy(tmp_path: Path) -> None:
    records = example_run("agent-calculator-cpu.yaml", tmp_path, steps=STEPS, timeout=500)
    rate = window_means(records, "agent/tool_call_rate", WINDOW)
    reward = window_means(records, "critic/score/mean", WINDOW)
    print(
        f"tool call rate {rate[0]:.3f} → {rate[1]:.3f}, reward {reward[0]:.3f} → {reward[1]:.3f}; per step "
        f"{[(round(r['agent/tool_call_rate'], 3), round(r['critic/score/mean'], 3)) for r in records]}"
    )
    # the starting policy calls in part of its samples only, and calling is what earns the reward
    assert 0.05 <= rate[0] <= 0.6, rate
    assert rate[1] >= rate[0] + RATE_GAIN, rate
    assert reward[1] >= reward[0] + REWARD_GAIN, reward
    errors = [r.get("agent/tool_error_rate", 0.0) for r in records[-WINDOW:]]  # absent in a step without calls
    assert sum(errors) / WINDOW <= 0.1, errors  # the learned calls are well formed
