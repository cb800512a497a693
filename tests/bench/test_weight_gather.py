"""bench/weight_gather.py on CPU (gloo, one rank): every way gives the baseline's tensors under the same names, and
the result records each way against the baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_way_gathers_the_same_weights(tmp_path: Path) -> None:
    out = tmp_path / "gather.json"
    command = [sys.executable, "bench/weight_gather.py", "--device", "cpu", "--models", "smollm2-shape"]
    done = subprocess.run(
        [*command, "--repeats", "1", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["models"]
    assert row["model"] == "smollm2-shape" and row["tensors"] > 0
    assert sorted(row["ways"]) == ["local", "local_detached_first", "per_module", "per_parameter"]
    assert all(way["equal_to_baseline"] for way in row["ways"].values())
    assert row["ways"]["per_parameter"]["baseline_over_this"] == 1.0
