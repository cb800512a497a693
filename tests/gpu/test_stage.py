"""tests/gpu/stage.sh, the staging calls to the GPU machine: pure file moves, so these run on CPU, in CI too."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

STAGE = Path(__file__).with_name("stage.sh")
CALLS = 9
MIB = 2**20


def stage(*args: str, device: Path, machine: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEVICE": str(device), "MACHINE_ROOT": str(machine or device / "machine")}
    return subprocess.run(["bash", str(STAGE), *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def device(tmp_path: Path) -> Path:
    """A .device/ laid out as `stage.sh prepare` leaves it, with one small file per carried folder."""
    root = tmp_path / "device"
    files = [f"bundle/c{n}/part{n}.whl" for n in range(1, 8)]
    files += ["bundle/install.sh", "bundle/SHA256SUMS", "bundle/CHUNKS", "verl-stage/verl.whl", "verl-stage/SHA256SUMS"]
    files += ["smollm2/p0/smol.whl.part00", "smollm2/p1/smol.whl.part01", "x1/cel.whl", "x1/EXTRA_SHA256SUMS"]
    files += ["x-trl/trl.whl"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    return root


def test_calls_lists_each_call_s_carry_within_the_limit(device: Path) -> None:
    run = stage("calls", device=device)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == CALLS
    assert lines[0].startswith("call 1") and f'"{device}/bundle/install.sh"' in lines[0]
    assert f'carry ["{device}/smollm2/p1", "{device}/x1", "{device}/x-trl"]' in lines[-1]


def test_a_call_over_64_mib_is_refused_by_number(device: Path) -> None:
    with (device / "bundle/c3/part3.whl").open("wb") as big:
        big.truncate(64 * MIB)  # over 64 MiB with anything beside it
    run = stage("calls", device=device)
    assert run.returncode == 1
    assert "call 3 carries" in run.stderr and "64 MiB" in run.stderr


def test_a_missing_carried_folder_names_the_fix(device: Path) -> None:
    (device / "x-trl/trl.whl").unlink()
    (device / "x-trl").rmdir()
    run = stage("calls", device=device)
    assert run.returncode == 1
    assert "x-trl is missing" in run.stderr and "stage.sh prepare" in run.stderr


def test_put_lays_each_carried_folder_flat_where_the_install_looks(device: Path, tmp_path: Path) -> None:
    machine = tmp_path / "root"
    for n in (1, 7, 9):
        run = stage("put", str(n), device=device, machine=machine)
        assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (machine / "stage").iterdir()) == [
        "CHUNKS",
        "SHA256SUMS",
        "install.sh",
        "part1.whl",
        "part7.whl",
    ]
    assert sorted(p.name for p in (machine / "verl-stage").iterdir()) == ["SHA256SUMS", "verl.whl"]
    assert [p.name for p in (machine / "extra-parts").iterdir()] == ["smol.whl.part01"]
    assert sorted(p.name for p in (machine / "extra").iterdir()) == ["EXTRA_SHA256SUMS", "cel.whl", "trl.whl"]


@pytest.mark.parametrize("call", ["0", str(CALLS + 1), "two", ""])
def test_put_refuses_a_call_that_is_not_one(device: Path, call: str) -> None:
    run = stage("put", call, device=device)
    assert run.returncode == 1
    assert f"N is a staging call, 1 to {CALLS}" in run.stderr


def test_put_of_a_call_whose_carry_did_not_travel_says_what_to_carry(device: Path) -> None:
    (device / "smollm2/p0/smol.whl.part00").unlink()
    (device / "smollm2/p0").rmdir()
    run = stage("put", "8", device=device)
    assert run.returncode == 1
    assert "smollm2/p0 was not carried" in run.stderr and "stage.sh calls" in run.stderr
