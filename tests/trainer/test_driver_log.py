"""The RayJob entrypoint keeps the driver's output on the checkpoint claim (DRIVER_LOG under checkpointDir), where
`kuberl logs` reads it: every attempt appends after a header, the terminal still gets everything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kuberl.api.contract import DRIVER_LOG
from tests.api.cases import BASE

SCRIPT = """
import logging, sys
from kuberl.trainer.observe.driver_log import teed
with teed(sys.argv[1], "job"):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    print("step 1/2 | reward 0.1")
    logging.getLogger("x").warning("a warning")
    print("to stderr", file=sys.stderr)
"""


def test_each_attempt_appends_its_output_after_a_header(tmp_path: Path) -> None:
    for _ in range(2):  # a head pod that restarted: the second attempt appends
        result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert "step 1/2 | reward 0.1" in result.stdout and "to stderr" in result.stderr
    log = (tmp_path / DRIVER_LOG).read_text().splitlines()
    headers = [line for line in log if line.startswith("=== ") and "RLJob job: the driver starts on" in line]
    assert len(headers) == 2
    assert log.count("step 1/2 | reward 0.1") == 2 and log.count("WARNING a warning") == 2
    assert log.count(f"driver log: {tmp_path / DRIVER_LOG} (`kuberl logs job` reads it)") == 2


def test_the_entrypoint_writes_it_under_the_pods_checkpoint_dir_even_when_it_fails(tmp_path: Path) -> None:
    spec = json.loads(json.dumps(BASE["spec"]))
    spec["model"]["path"] = "/nowhere/model"
    spec["trainer"] = {"checkpointDir": str(tmp_path / "ckpt")}
    spec["data"]["trainFiles"] = [str(tmp_path / "missing.parquet")]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    command = [sys.executable, "-m", "kuberl.trainer.run", "--spec-file", str(tmp_path / "spec.json"), "--name", "job"]
    result = subprocess.run([*command, "--address", "local"], capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    log = (tmp_path / "ckpt" / DRIVER_LOG).read_text()
    assert "RLJob job: the driver starts on" in log
    assert "missing.parquet" in log or "/nowhere/model" in log, log[-2000:]
