"""The run's sandbox pools: the Service on Kubernetes, a given address, or a local server that lives exactly as long
as the run (stopped at its end, killed with it by the kernel, its failure to start reported with its log)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kuberl.api.contract import SANDBOX_REWARD, SANDBOX_TOOLS
from kuberl.sandbox.client import PoolAddress, job_sandbox, pool_variable
from kuberl.sandbox.jail import children_of
from kuberl.sandbox.protocol import Execution
from kuberl.trainer.commands import sandbox_addresses
from kuberl.trainer.sandboxes import LocalSandboxError, service_addresses
from tests.trainer.kuberl_cli import REPO, cli_env
from tests.trainer.sandbox_pools import require_isolation, served, spec_with_pools


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def servers() -> list[int]:
    """The local servers this process started (`python -m kuberl.sandbox serve`)."""
    return [
        pid for pid in children_of(os.getpid()) if b"kuberl.sandbox\0serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def test_on_kubernetes_each_pool_is_its_service() -> None:
    spec = spec_with_pools(reward={}, tools={})
    assert service_addresses("coder", "team-a", spec) == {
        SANDBOX_REWARD: "http://coder-sandbox-reward.team-a.svc:8000",
        SANDBOX_TOOLS: "http://coder-sandbox-tools.team-a.svc:8000",
    }


def test_kuberl_run_takes_an_address_per_declared_pool() -> None:
    spec = spec_with_pools(reward={})
    assert sandbox_addresses(["reward=unix:/run/sandbox.sock"], spec) == {"reward": "unix:/run/sandbox.sock"}
    with pytest.raises(ValueError, match=r"--sandbox reward: write POOL=ADDRESS"):
        sandbox_addresses(["reward"], spec)
    with pytest.raises(ValueError, match=r"the RLJob has no 'tools' sandbox pool; its pools: reward"):
        sandbox_addresses(["tools=http://x:8000"], spec)


def test_a_local_server_serves_the_run_and_is_gone_after_it(tmp_path: Path) -> None:
    spec = spec_with_pools(reward={"replicas": 2, "executionsPerPod": 3})
    with served(spec, tmp_path) as pools:
        (pid,) = servers()
        where = pools[SANDBOX_REWARD]
        assert where.concurrency == 6 and where.address.startswith("unix:")
        assert json.loads(os.environ[pool_variable(SANDBOX_REWARD)]) == {"address": where.address, "concurrency": 6}
        result = job_sandbox(SANDBOX_REWARD, request_seconds=30).execute(Execution("print(6 * 7)"))
        assert result.runs[0].stdout == "42\n"
    assert not alive(pid)
    assert not Path(where.address.removeprefix("unix:")).parent.exists()
    assert pool_variable(SANDBOX_REWARD) not in os.environ
    assert "serving on unix:" in (tmp_path / "sandbox-reward.log").read_text()


def test_a_given_address_is_announced_and_no_server_started(tmp_path: Path) -> None:
    spec = spec_with_pools(reward={"executionsPerPod": 4}, tools={})
    with served(spec, tmp_path, reward="http://sandbox.example:8000") as pools:
        assert pools[SANDBOX_REWARD] == PoolAddress("http://sandbox.example:8000", 4)
        assert pools[SANDBOX_TOOLS].address.startswith("unix:")
    assert not (tmp_path / "sandbox-reward.log").exists()
    assert (tmp_path / "sandbox-tools.log").exists()


def test_a_server_killed_while_starting_fails_the_run_with_its_status_and_log(tmp_path: Path) -> None:
    require_isolation()

    def kill_the_server() -> None:
        deadline = time.monotonic() + 60
        while not (started := servers()) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(started[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server)
    killer.start()
    with (
        pytest.raises(
            LocalSandboxError, match=r"server of the reward pool exited with status -9: .*sandbox-reward.log"
        ),
        served(spec_with_pools(reward={}), tmp_path),
    ):
        pass
    killer.join()


RUN_AND_WAIT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.trainer.sandbox_pools import served, spec_with_pools
    with served(spec_with_pools(reward={}), Path(sys.argv[1])):
        print("serving", flush=True)
        time.sleep(600)
    """
)


def test_a_run_killed_with_sigkill_takes_its_local_server_along(tmp_path: Path) -> None:
    require_isolation()
    run = subprocess.Popen(
        [sys.executable, "-c", RUN_AND_WAIT, str(tmp_path)], cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert run.stdout is not None and run.stdout.readline() == "serving\n"
        (server,) = children_of(run.pid)
        run.kill()
        run.wait()
        deadline = time.monotonic() + 30
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(server)
    finally:
        run.kill()
