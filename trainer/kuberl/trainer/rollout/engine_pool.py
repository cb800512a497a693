"""The separate rollout's engines seen from the driver, as a pool that may grow, shrink and lose engines while the
job runs (``cluster.rollout.nodes`` changes, a rollout pod is deleted or preempted, an engine process dies).

**Slots** are where engines should run. On the RayJob's Ray cluster (the ``pools`` layout) every alive node labelled
``kuberl.io/pool=rollout`` has ``layout.engines / cluster.rollout.nodes`` slots, so the pool follows the rollout
worker group as the operator resizes it; elsewhere (``disjoint``, ``shared``) there are the plan's
``layout.engines`` slots. :meth:`EnginePool.refresh` starts an engine in every slot without one (a node that
joined, an engine that died on a node still there) and drops the engines of nodes that left.

**An engine's life**: *starting* (its Ray actor is created and loads the model) → *joining* (up, without the
trainer's weights) → *active* (it holds the current weights; only active engines generate) → gone (its actor or
node died: :meth:`EnginePool.lose`). Weights reach joining engines only from the driver's main thread, which also
drives the trainer ranks' collectives: at every weight update (:meth:`EnginePool.update`) and while no engine is
active (:meth:`EnginePool.admit_if_empty`), so an engine never generates before it holds the policy's weights.

With no active engine the pool waits up to ``runPolicy.emptyRolloutPoolTimeoutSeconds`` for one to join, then
raises :class:`RolloutPoolEmptyError` (a transient failure: the attempt is retried under ``backoffLimit``).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from kuberl.api.contract import POOL_LABEL, ROLLOUT_POOL
from kuberl.trainer.model.microbatch import Rows, concat
from kuberl.trainer.plan.layout import RolloutLayout, engine_actor_options
from kuberl.trainer.rollout.base import Rollout, RolloutBatch
from kuberl.trainer.rollout.registry import SeparateEngine

REFRESH_SECONDS = 1.0
"""How often the pool reads the Ray cluster's nodes and the engines still starting."""
MAX_START_FAILURES = 3
"""Engines of one slot that may die before they are up; then the slot is given up (with a warning)."""

Send = Callable[[list[Any], int], list[int]]
"""Send weights ``version`` to these engine actors (all of them the trainer's weight transfer connects to); the
indices of those found dead."""
Slot = tuple[str | None, int]
"""(node id, index on that node) in the ``pools`` layout; (None, engine index) elsewhere."""


class RolloutPoolEmptyError(RuntimeError):
    """No rollout engine was left, and none joined within runPolicy.emptyRolloutPoolTimeoutSeconds."""


@dataclass(eq=False)
class PoolEngine:
    """One engine actor of the pool and what the pool knows of it."""

    handle: Any
    slot: Slot
    number: int
    """Its place in the order engines were started (its sampling seed is the plan's seed plus this)."""
    state: Literal["starting", "joining", "active"] = "starting"
    starting: Any = None
    """The ``ready()`` reference while starting."""
    busy: bool = False
    """A generation of the asynchronous stream is in flight on it."""


@dataclass
class EngineClock:
    """Engine-seconds of active engines, and of those without a stream generation in flight, integrated as the pool
    changes."""

    active_seconds: float = 0.0
    idle_seconds: float = 0.0
    active: int = 0
    idle: int = 0
    since: float = field(default_factory=time.monotonic)

    def advance(self, active: int, idle: int) -> None:
        now = time.monotonic()
        self.active_seconds += self.active * (now - self.since)
        self.idle_seconds += self.idle * (now - self.since)
        self.active, self.idle, self.since = active, idle, now


class EnginePool(Rollout):
    """The separate engines: :meth:`generate` fans a batch out over the active ones (whole prompts per engine, so a
    GRPO group stays on one engine) and generates a lost engine's share again on the others; the asynchronous stream
    (:class:`~kuberl.trainer.experience.stream.GroupStream`) takes single idle engines with :meth:`acquire`."""

    def __init__(
        self,
        separate: SeparateEngine,
        layout: RolloutLayout,
        *,
        model_path: str,
        pad_id: int,
        seed: int,
        engines_per_node: int,
        trainer_placement_group: Any,
        share: float,
        empty_timeout: float,
        send: Send,
        write: Callable[[str], None],
    ) -> None:
        self.separate = separate
        self.layout = layout
        self.model_path = model_path
        self.pad_id = pad_id
        self.seed = seed
        self.engines_per_node = engines_per_node
        self.trainer_placement_group = trainer_placement_group
        self.share = share
        self.empty_timeout = empty_timeout
        self.send = send
        self.write = write
        self.on_change: Callable[[int], None] = lambda active: None
        """Told the number of active engines whenever it changes (the RLJob's status.progress.rolloutEngines)."""
        self.lock = threading.RLock()
        self.engines: list[PoolEngine] = []
        self.started = 0
        self.start_failures: dict[Slot, int] = {}
        self.last_start_error = ""
        """Why the last engine that died before it was up died (named when no engine is up at the start)."""
        self.version = 0
        """The weights every active engine holds: the trainer step they are the result of."""
        self.updating = False
        """A weight update is under way: nothing new is dispatched until the engines hold the new weights."""
        self.empty_since: float | None = time.monotonic()
        self.next_refresh = 0.0
        self.clock = EngineClock()

    # --- membership -------------------------------------------------------------------------------------------

    @property
    def active(self) -> list[PoolEngine]:
        with self.lock:
            return [e for e in self.engines if e.state == "active"]

    @property
    def size(self) -> int:
        """Active engines, the ones that generate."""
        return len(self.active)

    def start(self) -> None:
        """Start an engine in every slot the Ray cluster has now and wait until they are up (joining), up to the
        empty-pool timeout: past it the pool goes on with the engines that are up (one still starting joins at a
        later refresh), and with none up it raises, naming what it waited for."""
        import ray

        deadline = time.monotonic() + self.empty_timeout
        while True:
            self.refresh(force=True)
            with self.lock:
                starting = [e for e in self.engines if e.state == "starting"]
                joining = any(e.state == "joining" for e in self.engines)
            late = time.monotonic() > deadline
            if joining and (late or not starting):
                if starting:
                    self.write(f"warning: {self._still_starting(starting)}; going on without them")
                return
            if late:
                raise RolloutPoolEmptyError(self._none_started(starting))
            if starting:
                ray.wait([e.starting for e in starting], num_returns=len(starting), timeout=REFRESH_SECONDS)
            else:
                time.sleep(REFRESH_SECONDS)

    def _still_starting(self, starting: list[PoolEngine]) -> str:
        slots = ", ".join(
            f"engine {e.number} on {'node ' + e.slot[0] if e.slot[0] else 'slot ' + str(e.slot[1])}" for e in starting
        )
        return f"{len(starting)} rollout engine(s) not up after {self.empty_timeout:.0f} s ({slots})"

    def _none_started(self, starting: list[PoolEngine]) -> str:
        timeout = f"{self.empty_timeout:.0f} s (runPolicy.emptyRolloutPoolTimeoutSeconds = {self.empty_timeout:.0f})"
        given_up = sum(1 for failures in self.start_failures.values() if failures >= MAX_START_FAILURES)
        failed = (
            f"; {given_up} slot(s) given up after {MAX_START_FAILURES} engines died starting there "
            f"(the last: {self.last_start_error})"
            if given_up
            else ""
        )
        if starting:
            return (
                f"no rollout engine came up within {timeout}: {self._still_starting(starting)}, still starting: Ray "
                "cannot place an engine actor while its node's CPUs or GPUs are taken, or the engine is still "
                f"loading the model{failed}; check `ray status` on the head and the rollout pods' resources, or "
                "raise runPolicy.emptyRolloutPoolTimeoutSeconds for a slow model load"
            )
        if given_up:
            return (
                f"no rollout engine could start within {timeout}{failed}: the rollout pods lack what an engine "
                "asks for, or the engine fails as it starts; check the rollout pods' resources and the engine's log"
            )
        return (
            f"no rollout engine could start within {timeout}: no Ray node of the rollout pool "
            f"({POOL_LABEL}={ROLLOUT_POOL}) is up; check the RayJob's rollout worker group's pods"
        )

    def refresh(self, *, force: bool = False) -> None:
        """At most every :data:`REFRESH_SECONDS` (unless ``force``): engines that finished starting join, engines on
        nodes that left are lost, and every slot without an engine gets one."""
        import ray

        now = time.monotonic()
        with self.lock:
            if not force and now < self.next_refresh:
                return
            self.next_refresh = now + REFRESH_SECONDS
            starting = [e for e in self.engines if e.state == "starting"]
        if starting:
            done, _ = ray.wait([e.starting for e in starting], num_returns=len(starting), timeout=0)
            for engine in starting:
                if engine.starting in done:
                    self._started(engine)
        slots = self.slots()
        with self.lock:
            gone = [e for e in self.engines if e.slot not in slots]
        for engine in gone:
            self.lose(engine, "its node left the Ray cluster")
        with self.lock:
            taken = {e.slot for e in self.engines}
            empty = [s for s in slots if s not in taken and self.start_failures.get(s, 0) < MAX_START_FAILURES]
        for slot in empty:
            self.spawn(slot)

    def slots(self) -> list[Slot]:
        if self.layout.engine_label_selector is None:
            return [(None, i) for i in range(self.layout.engines)]
        import ray

        nodes = [
            n["NodeID"]
            for n in ray.nodes()
            if n.get("Alive") and (n.get("Labels") or {}).get(POOL_LABEL) == ROLLOUT_POOL
        ]
        return [(node, i) for node in nodes for i in range(self.engines_per_node)]

    def spawn(self, slot: Slot) -> None:
        import ray

        node, index = slot
        options = {
            **engine_actor_options(
                self.layout,
                index if node is None else 0,
                trainer_placement_group=self.trainer_placement_group,
                share=self.share,
            ),
            **self.separate.actor_options,
        }
        if node is not None:  # this node of the rollout pool, not any: its slot goes when it goes
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options.pop("label_selector", None)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        remote: Any = ray.remote(self.separate.actor_class)
        handle = remote.options(**options).remote(
            self.model_path, pad_id=self.pad_id, seed=self.seed + self.started, **self.separate.kwargs
        )
        with self.lock:
            self.engines.append(PoolEngine(handle, slot, self.started, starting=handle.ready.remote()))
            self.started += 1

    def _started(self, engine: PoolEngine) -> None:
        import ray

        try:
            ray.get(engine.starting)
        except ray.exceptions.RayError as exc:
            with self.lock:
                self.start_failures[engine.slot] = failures = self.start_failures.get(engine.slot, 0) + 1
                self.engines.remove(engine)
            given_up = " (giving its slot up)" if failures >= MAX_START_FAILURES else ""
            self.last_start_error = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.write(f"warning: rollout engine {engine.number} did not start{given_up}: {exc}")
            return
        with self.lock:
            engine.state, engine.starting = "joining", None

    def lose(self, engine: PoolEngine, reason: str) -> None:
        """Drop ``engine`` (its actor or node died); its generations in flight are the caller's to repeat."""
        import ray

        with self.lock:
            if engine not in self.engines:
                return
            was_active = engine.state == "active"
            self.engines.remove(engine)
            active = self._recount()
        with contextlib.suppress(Exception):
            ray.kill(engine.handle)
        self.write(f"rollout engine {engine.number} lost ({reason}); {active} active engine(s) left")
        if was_active:
            self.on_change(active)

    def _recount(self) -> int:
        """Bookkeeping after the active engines changed (under the lock): their number."""
        active = sum(e.state == "active" for e in self.engines)
        self.clock.advance(active, sum(e.state == "active" and not e.busy for e in self.engines))
        if active == 0 and self.empty_since is None:
            self.empty_since = time.monotonic()
        elif active:
            self.empty_since = None
        return active

    # --- weights ----------------------------------------------------------------------------------------------

    def update(self, version: int) -> None:
        """Send weights ``version`` to the active and joining engines (the driver's main thread, at a weight update):
        nothing is dispatched meanwhile, so with partial rollouts the engines stop what they generate, and without
        them the update waits for it."""
        self.refresh(force=True)
        with self.lock:
            self.updating = True
        try:
            self._send([e for e in self.engines if e.state != "starting"], version)
        finally:
            with self.lock:
                self.updating = False

    def admit_if_empty(self) -> None:
        """With no active engine, send the weights the others would hold to the engines that joined since."""
        self.refresh()
        with self.lock:
            joining = [e for e in self.engines if e.state == "joining"]
            if not joining or any(e.state == "active" for e in self.engines):
                return
        self._send(joining, self.version)

    def _send(self, engines: list[PoolEngine], version: int) -> None:
        joined = [e for e in engines if e.state == "joining"]
        lost = set(self.send([e.handle for e in engines], version)) if engines else set()
        for index in sorted(lost):
            self.lose(engines[index], "it died before it loaded the weights")
        with self.lock:
            self.version = version
            for engine in engines:
                if engine in self.engines:
                    engine.state = "active"
            active = self._recount()
        if any(e in self.engines for e in joined):
            admitted = ", ".join(str(e.number) for e in joined if e in self.engines)
            self.write(f"rollout engine(s) {admitted} joined with weights {version}; {active} active")
            self.on_change(active)

    def check_not_empty_too_long(self) -> None:
        """Raise :class:`RolloutPoolEmptyError` once no engine has been active for the empty-pool timeout."""
        with self.lock:
            since = self.empty_since
        if since is not None and time.monotonic() - since > self.empty_timeout:
            raise RolloutPoolEmptyError(
                f"no rollout engine for {time.monotonic() - since:.0f} s (runPolicy.emptyRolloutPoolTimeoutSeconds "
                f"= {self.empty_timeout:.0f}): every engine of the rollout pool was lost (its pod deleted or "
                "preempted, or its process died) and none joined; this attempt fails and is retried under "
                "runPolicy.backoffLimit. Check the RayJob's rollout worker group and the Ray nodes labelled "
                f"{POOL_LABEL}={ROLLOUT_POOL}"
            )

    def wait_for_active(self) -> list[PoolEngine]:
        """The active engines, once there is one (admitting joined engines if this is the driver's main thread)."""
        while True:
            self.refresh()
            if threading.current_thread() is threading.main_thread():
                self.admit_if_empty()
            active = self.active
            if active:
                return active
            self.check_not_empty_too_long()
            time.sleep(REFRESH_SECONDS / 4)

    # --- generation -------------------------------------------------------------------------------------------

    def acquire(self) -> PoolEngine | None:
        """An idle active engine, marked busy; None while none is idle or the weights are being updated."""
        with self.lock:
            if self.updating:
                return None
            engine = next((e for e in self.engines if e.state == "active" and not e.busy), None)
            if engine is not None:
                engine.busy = True
                self._recount()
            return engine

    def release(self, engine: PoolEngine) -> None:
        with self.lock:
            engine.busy = False
            self._recount()

    def engine_seconds(self) -> tuple[float, float]:
        """Engine-seconds of active engines so far, and of those spent idle (no stream generation in flight)."""
        with self.lock:
            self._recount()
            return self.clock.active_seconds, self.clock.idle_seconds

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = -1,
        max_new_tokens: int,
        stop: tuple[str, ...] = (),
    ) -> RolloutBatch:
        """``n`` responses per prompt over the active engines; the share of an engine lost meanwhile is generated
        again on the others."""
        import ray

        sampling = {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "max_new_tokens": max_new_tokens,
            "stop": stop,
        }
        todo = [(0, prompts)]
        done: dict[int, Rows] = {}
        while todo:
            engines = self.wait_for_active()
            shares = [
                (start + offset, part[offset : offset + size])
                for start, part in todo
                for size in [math.ceil(len(part) / len(engines))]
                for offset in range(0, len(part), size)
            ]
            calls = [
                (engine, start, share, engine.handle.generate.remote(share, n, sampling))
                for (start, share), engine in zip(shares, engines * len(shares), strict=False)
            ]
            todo = []
            for engine, start, share, call in calls:
                try:
                    done[start] = ray.get(call)
                except ray.exceptions.RayActorError as exc:
                    self.lose(engine, f"it died while generating: {type(exc).__name__}")
                    todo.append((start, share))
        parts = [{k: v for k, v in done[start].items() if k != "finished"} for start in sorted(done)]
        return RolloutBatch.from_rows(parts[0] if len(parts) == 1 else concat(parts, self.pad_id))

    def kill(self) -> None:
        import ray

        with self.lock:
            engines, self.engines = self.engines, []
        for engine in engines:
            with contextlib.suppress(Exception):
                ray.kill(engine.handle)
