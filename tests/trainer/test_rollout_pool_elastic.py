"""The separate rollout pool on a real multi-node Ray cluster (:mod:`tests.trainer.ray_nodes`), one cluster for
the module: rollout nodes (``ray start --address …`` labelled as the rollout pool) join and leave while the
asynchronous trainer runs. The goal scenario goes 2 → 1 → 3 engines: a node SIGKILLed mid-batch (a pod deleted),
then the last engine's process SIGKILLed mid-generation (the pool is empty until its replacement on the same node
has the weights), then two nodes joining; it finishes with every step trained once and no prompt twice. A pool
that stays empty past runPolicy.emptyRolloutPoolTimeoutSeconds fails the attempt with an error naming it, and so
does one whose engines never come up (a rollout pod without a CPU for its engine, one whose CPU is taken)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.raypods import process_tree
from kuberl.api import parse_spec
from kuberl.api.contract import POOL_LABEL, ROLLOUT_POOL
from kuberl.trainer.observe.metrics import read_jsonl
from tests.trainer.ray_nodes import ENV, RayNodes, alive_rollout_nodes, auth_env, wait_until
from tests.trainer.test_run_async_cpu import BATCH, Recorder, spec

pytestmark = pytest.mark.slow
STEPS = 6
"""Every weight update up to step 3's admits groups to generate (the staleness bound, (version + 3) batches, stays
within the run's 6): a kill armed as steps 2 and 3 start meets a generation by then."""


@pytest.fixture(scope="module")
def nodes() -> Iterator[RayNodes]:
    """A head of the trainer pool and, as each test adds them, rollout nodes; the test process is the driver."""
    import ray

    with pytest.MonkeyPatch.context() as monkeypatch:
        for key, value in {**ENV, **auth_env()}.items():
            monkeypatch.setenv(key, value)
        for _attempt in range(3):  # a head that misses Ray's 30 s to start on a loaded machine is started again
            cluster = RayNodes()
            if cluster.started(cluster.head):
                break
            cluster.close()
        else:
            pytest.fail("the Ray head did not come up in 3 attempts")
        try:
            ray.init(address=cluster.address, log_to_driver=False)
            yield cluster
        finally:
            ray.shutdown()
            cluster.close()


def add_rollout_nodes(nodes: RayNodes, count: int, cpus: int = 1) -> list[Any]:
    """``count`` more rollout nodes of ``cpus`` CPUs, up. Ray gives a starting raylet 30 s to register, which a
    loaded machine may miss: a node process that exits before it is up is started again (a pod's container
    restarted)."""
    expected = alive_rollout_nodes() + count
    added = [nodes.add_rollout_node(cpus) for _ in range(count)]

    def up() -> bool:
        for i, node in enumerate(added):
            if node.poll() is not None:
                added[i] = nodes.add_rollout_node(cpus)
        return alive_rollout_nodes() >= expected

    wait_until(up, f"{count} more rollout node(s)", timeout=300)
    return added


def elastic_spec(tmp_path: Path, *, rollout_nodes: int, empty_timeout: int = 300) -> dict:
    """Responses of up to 128 tokens (the random tiny policy rarely samples eos): a generation call lasts long enough
    that a kill right after it went out finds it running."""
    doc = spec(tmp_path / "ckpt", staleness=2, response_length=128)
    doc["trainer"]["totalSteps"] = STEPS
    doc["cluster"]["rollout"] = {"nodes": rollout_nodes, "gpusPerNode": 1}
    doc["runPolicy"] = {"emptyRolloutPoolTimeoutSeconds": empty_timeout}
    return doc


def node_of(nodes: RayNodes, node_id: str) -> Any:
    """The ``ray start`` process of the Ray node ``node_id`` (its raylet's socket names it)."""
    import ray

    (socket,) = [n["RayletSocketName"] for n in ray.nodes() if n["NodeID"] == node_id]
    for node in nodes.nodes:
        for pid in process_tree(node.pid):
            with contextlib.suppress(OSError):
                if f"--raylet_socket_name={socket}" in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"):
                    return node
    raise AssertionError(f"no node process runs the raylet of {node_id}")


def kill_at_next_generation(trainer: Any, kill: Callable[[Any], None]) -> threading.Event:
    """``kill(engine)`` for the next generation the stream hands an engine, right after its call went out: the fault
    lands with the call in flight, whenever that generation comes (a tiny engine's takes a fraction of a second, and
    none comes while the queue is at its staleness bound); the event is set once it did."""
    stream = trainer.experience.stream
    call = stream.call
    fired = threading.Event()

    def calling(chunk: Any) -> Any:
        answer = call(chunk)
        if not fired.is_set():
            kill(chunk.engine)
            fired.set()
        return answer

    stream.call = calling
    return fired


def run(doc: dict, run_dir: Path, recorder: Recorder, events: dict[int, Callable[[Any], None]]) -> int:
    """The run through the driver's own loop; ``events[step](trainer)`` happens as step ``step`` starts, before it
    takes its batch."""
    from kuberl.trainer.driver.trainer import Trainer

    trainer = Trainer("elastic", parse_spec(doc), run_dir=run_dir, show_progress=False)
    try:
        trainer.setup()
        recorder.wrap(trainer)
        take = trainer.experience.take

        def with_events(timer, *, generate_next):  # type: ignore[no-untyped-def]
            event = events.get(trainer.global_step + 1)
            if event is not None:
                event(trainer)
            return take(timer, generate_next=generate_next)

        trainer.experience.take = with_events
        return trainer.fit()
    finally:
        trainer.shutdown()


def check_trained_once(run_dir: Path, recorder: Recorder) -> list[dict]:
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert sorted(recorder.staleness) == list(range(1, STEPS + 1))
    assert all(0 <= s <= 2 for staleness in recorder.staleness.values() for s in staleness)
    prompts = [p for step in sorted(recorder.prompts) for p in recorder.prompts[step]]
    assert len(prompts) == len(set(prompts)) == STEPS * BATCH
    return steps


def engine_process(nodes: RayNodes, engine: Any) -> int:
    """The pid of ``engine``'s actor process on its node."""
    node = node_of(nodes, engine.slot[0])
    (pid,) = [
        p for p in process_tree(node.pid) if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"ray::HFEngineActor")
    ]
    return pid


@pytest.mark.timeout(900)
def test_the_pool_goes_from_two_engines_to_one_to_none_and_back_and_to_three_with_every_step_trained_once(
    tmp_path: Path, nodes: RayNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kuberl.trainer.observe.reporting import Reporting

    add_rollout_nodes(nodes, 2)
    killed: list[int] = []
    fired: list[threading.Event] = []
    reported: list[int] = []  # the active engines the status heard of, at each change
    monkeypatch.setattr(Reporting, "rollout_engines", lambda self, count: reported.append(count))

    def kill_a_pod_mid_batch(trainer: Any) -> None:
        fired.append(kill_at_next_generation(trainer, lambda engine: nodes.kill(node_of(nodes, engine.slot[0]))))

    def kill_engine_process(engine: Any) -> None:
        killed.append(engine_process(nodes, engine))
        os.kill(killed[-1], signal.SIGKILL)

    def kill_the_last_engine_process_mid_generation(trainer: Any) -> None:
        pool = trainer.cluster.rollout
        wait_until(lambda: fired[0].is_set() and pool.size == 1, "the killed pod's engine dropped", timeout=60)
        fired.append(kill_at_next_generation(trainer, kill_engine_process))

    def two_pods_join(trainer: Any) -> None:
        pool = trainer.cluster.rollout
        # the pool was empty (its replacement may have joined already: the driver admits it while it waits)
        wait_until(lambda: fired[1].is_set() and 0 in reported, "the killed engine dropped", timeout=60)
        # the pool drops an engine as its call fails, which may be before the GCS declares the killed pod's node dead
        wait_until(lambda: alive_rollout_nodes() == 1, "the killed pod's node declared dead", timeout=60)
        add_rollout_nodes(nodes, 2)
        # three engines up: the two new pods' (awaiting weights) and the one started again on the surviving pod
        wait_until(lambda: sum(e.state != "starting" for e in pool.engines) == 3, "three engines up")

    recorder = Recorder()
    doc = elastic_spec(tmp_path, rollout_nodes=2)
    events = {2: kill_a_pod_mid_batch, 3: kill_the_last_engine_process_mid_generation, 4: two_pods_join}
    assert run(doc, tmp_path / "run", recorder, events) == 0
    steps = check_trained_once(tmp_path / "run", recorder)
    assert killed and alive_rollout_nodes() == 3  # the engine's process died, its node did not
    # the status heard each change: a pod gone, the pool empty, then the engine started again on its node and the two
    # that joined (all three at once when the replacement had got no weights before step 4)
    assert reported in ([1, 0, 1, 3], [1, 0, 3])
    # each step's engines after its weight update: a kill armed at a step's start lands by then, the engine may drop
    # just after it (and step 3's replacement may still be loading the model)
    engines = [r["rollout/engines"] for r in steps]
    assert engines[0] == 2 and engines[1] in (1, 2) and engines[2] in (0, 1) and engines[3:] == [3] * (STEPS - 3)
    assert sum(r["rollout/lost_groups"] for r in steps) >= 2  # both kills' groups were generated again


def keep_one_rollout_node(nodes: RayNodes) -> None:
    """The rollout pool down to one node (the scenario above leaves three; run alone, there is none)."""
    for node in nodes.nodes[1:]:
        if node.poll() is None:
            nodes.kill(node)
    wait_until(lambda: alive_rollout_nodes() == 0, "the rollout nodes gone", timeout=120)
    add_rollout_nodes(nodes, 1)


@pytest.mark.timeout(900)
def test_with_no_engine_left_past_the_timeout_the_attempt_fails_naming_it(tmp_path: Path, nodes: RayNodes) -> None:
    from kuberl.api.status import FailureClass
    from kuberl.trainer.driver.failures import classify
    from kuberl.trainer.rollout.engine_pool import RolloutPoolEmptyError

    keep_one_rollout_node(nodes)

    def lose_every_pod(trainer: Any) -> None:
        for engine in list(trainer.cluster.rollout.engines):
            with contextlib.suppress(AssertionError):  # two engines' slots may share a node
                nodes.kill(node_of(nodes, engine.slot[0]))
        wait_until(lambda: trainer.cluster.rollout.size == 0, "every engine dropped", timeout=60)

    doc = elastic_spec(tmp_path, rollout_nodes=1, empty_timeout=30)  # the same timeout bounds the engine's start
    started = time.monotonic()
    with pytest.raises(RolloutPoolEmptyError) as failed:
        run(doc, tmp_path / "run", Recorder(), {2: lose_every_pod})
    assert time.monotonic() - started < 300
    message = str(failed.value)
    assert "no rollout engine for" in message, message  # lost while running, not at the start
    assert "runPolicy.emptyRolloutPoolTimeoutSeconds = 30" in message and "kuberl.io/pool=rollout" in message
    assert classify(failed.value).kind == FailureClass.TRANSIENT  # retried under backoffLimit: not the job's end
    # the groups queued before the pool emptied (as step 2 started) may train steps more; the rest never came
    trained = [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
    assert trained == list(range(1, len(trained) + 1)) and 1 <= len(trained) < STEPS


@pytest.mark.timeout(600)
def test_engines_that_never_come_up_fail_the_start_naming_them(tmp_path: Path, nodes: RayNodes) -> None:
    """Two rollout pods whose engines never come up: one without a CPU for its engine (Ray refuses the actor: the
    slot is given up after its retries), one whose CPU another actor holds (the engine's actor waits to be placed).
    The start gives up after the empty-pool timeout instead of waiting forever, and says which is which."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from kuberl.trainer.rollout.engine_pool import MAX_START_FAILURES, RolloutPoolEmptyError

    keep_one_rollout_node(nodes)
    holder = None
    try:
        add_rollout_nodes(nodes, 1, cpus=0)
        (busy,) = [
            n["NodeID"]
            for n in ray.nodes()
            if n["Alive"] and n["Resources"].get("CPU") and (n.get("Labels") or {}).get(POOL_LABEL) == ROLLOUT_POOL
        ]
        holder = (
            ray.remote(num_cpus=1)(Holder)
            .options(scheduling_strategy=NodeAffinitySchedulingStrategy(busy, False))
            .remote()
        )
        ray.get(holder.ready.remote(), timeout=120)
        doc = elastic_spec(tmp_path, rollout_nodes=2, empty_timeout=10)
        started = time.monotonic()
        with pytest.raises(RolloutPoolEmptyError) as failed:
            run(doc, tmp_path / "run", Recorder(), {})
        assert time.monotonic() - started < 240
        message = str(failed.value)
        assert "within 10 s (runPolicy.emptyRolloutPoolTimeoutSeconds = 10)" in message, message
        assert re.search(rf"1 rollout engine\(s\) not up after 10 s \(engine \d+ on node {busy}\)", message), message
        assert f"1 slot(s) given up after {MAX_START_FAILURES} engines died starting there" in message, message
        assert "ray status" in message
    finally:
        if holder is not None:
            ray.kill(holder)


class Holder:
    """An actor that holds a CPU of its node."""

    def ready(self) -> bool:
        return True
