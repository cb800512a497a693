"""Asynchronous generation (``rollout.overlap: async``): the separate engines generate continuously, group by
group, into a bounded queue, and each step takes the first ``trainBatchSize`` groups that are ready (AReaL's
streaming rollouts, verl's fully-async trainer).

**Bounded staleness.** Every response carries the version of the weights its first token was sampled with (the
trainer step they are the result of); step ``s + 1`` trains the policy of version ``s``, so a group of version
``v`` is ``s − v`` versions stale and ``rollout.maxStaleness`` ``k`` bounds it. Generation is admitted only while
fewer than ``(version + k + 1) × trainBatchSize`` groups have been started in all (AReaL's rule), which keeps the
queue bounded by ``(k + 1) × trainBatchSize`` groups and every group within ``k`` when groups finish in the order
they started. A group that finishes so late that it would be older (a long response, an engine that was slow) is
**regenerated**: its responses are dropped, counted in ``rollout/dropped_groups``, and its prompt is generated again
with the current weights, so the data order still trains every prompt once.

**Partial rollouts** (``rollout.partialRollouts``): a weight update stops the generations in flight (the engine's
``load_weights`` interrupts them); the tokens already sampled are kept with the log-probs of the weights that sampled
them, and the responses are continued from there with the new weights (``rollout/interrupted_samples`` counts them
per step). The rollout correction then weighs every token by the weights that sampled it.

**Engines that come and go** (:class:`~kuberl.trainer.rollout.engine_pool.EnginePool`): a lost engine's groups in
flight are generated again on the others (``rollout/lost_groups``); while no engine is left, :meth:`GroupStream.take`
waits for one to join, up to ``runPolicy.emptyRolloutPoolTimeoutSeconds``.

**Checkpoints.** Groups finish, and are trained, out of their loader order. A checkpoint keeps the loader position
of the oldest prompt not trained yet and the prompts after it that were (``trained_ahead``, offsets from that
position); a resumed run generates the others again and skips those, so no prompt is trained twice.

One producer thread dispatches, collects and scores (the reward needs no trainer rank); the driver's main thread
only takes batches and updates weights.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kuberl.trainer.data.prompts import Prompt, PromptLoader
from kuberl.trainer.experience.batch import Scored
from kuberl.trainer.experience.scoring import Scorer
from kuberl.trainer.model.microbatch import Rows, concat
from kuberl.trainer.observe.metrics import Timer
from kuberl.trainer.plan.execution import Sampling
from kuberl.trainer.rollout.base import left_pad
from kuberl.trainer.rollout.engine_pool import EnginePool, PoolEngine

POLL_SECONDS = 0.05
"""How long the producer waits for a generation to come back before it looks for new work."""


@dataclass(frozen=True)
class Group:
    """One prompt to generate ``rolloutN`` responses for, and its place in the loader's order."""

    prompt: Prompt
    ordinal: int
    """Batch position × trainBatchSize + index in the batch: what a checkpoint records."""
    epoch: int


@dataclass
class Response:
    """One response as far as it is generated."""

    tokens: list[int]
    log_probs: list[float] | None
    version: int
    """The weights of its first token: what its staleness counts from."""
    finished: bool
    interrupted: bool = False
    """Stopped by a weight update at least once and continued with newer weights."""


@dataclass(eq=False)
class Unfinished:
    """A group some of whose responses a weight update stopped: continued once the engines hold newer weights."""

    group: Group
    responses: list[Response]
    stopped_at: int
    """The weights its stopped responses were generated with; they continue with any newer."""
    in_flight: int = 0
    """Responses being continued now."""

    @property
    def version(self) -> int:
        return min(r.version for r in self.responses)


@dataclass(eq=False)
class Chunk:
    """One generation call on one engine: fresh groups (``rolloutN`` rows each) or continued responses (one row
    each, its prompt followed by the tokens so far)."""

    engine: PoolEngine
    fresh: list[Group] = field(default_factory=list)
    continued: list[tuple[Unfinished, int]] = field(default_factory=list)


@dataclass
class Ready:
    """A group generated and scored, waiting to be trained."""

    group: Group
    rows: Rows
    scores: torch.Tensor
    extra: dict[str, torch.Tensor]
    version: int
    interrupted: int
    """Responses continued across a weight update."""


@dataclass
class Counters:
    """What happened since the last step took its batch."""

    dropped: int = 0
    lost: int = 0


class GroupStream:
    """The asynchronous experience source: :meth:`start` the producer, :meth:`take` one step's scored groups,
    :meth:`resume_position` for a checkpoint, :meth:`close`."""

    def __init__(
        self,
        *,
        pool: EnginePool,
        loader: PromptLoader,
        scorer: Scorer,
        sampling: Sampling,
        rollout_n: int,
        max_staleness: int,
        pad_id: int,
    ) -> None:
        self.pool = pool
        self.loader = loader
        self.scorer = scorer
        self.sampling = sampling
        self.n = rollout_n
        self.k = max_staleness
        self.batch_size = loader.batch_size
        self.pad_id = pad_id
        self.cond = threading.Condition()
        self.todo: deque[Group] = deque()
        """Prompts to generate: regenerated ones first, then the loader's next batches."""
        self.chunks: dict[Any, Chunk] = {}
        """In flight, by the Ray reference of the engine's answer."""
        self.unfinished: list[Unfinished] = []
        self.ready: list[Ready] = []
        self.trained: set[int] = set()
        """Ordinals trained, from the oldest untrained prompt's batch on."""
        self.untrained: set[int] = set()
        """Ordinals drawn and not trained yet, wherever they are: to generate, in flight, being scored, ready."""
        self.skip: set[int] = set()
        """Ordinals trained before the checkpoint this run resumed from."""
        self.started = 0
        """Groups admitted to generation (as counted by the staleness bound): the trained ones included."""
        self.limit = 0
        """Groups the run will train in all: nothing is admitted beyond."""
        self.admitting = True
        self.counters = Counters()
        self.clock_mark = (0.0, 0.0)
        """The pool's engine-seconds (active, idle) when the last step took its batch."""
        self.failure: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.produce, name="kuberl-async-rollout", daemon=True)

    # --- the driver's side ----------------------------------------------------------------------------------------

    def start(self, step: int, total_steps: int) -> None:
        """Start generating for step ``step + 1`` on; the engines hold the weights of ``step`` (the checkpoint's)."""
        self.restore(step, total_steps)
        self.thread.start()

    def restore(self, step: int, total_steps: int) -> None:
        """The bookkeeping of a run that trained ``step`` steps: the groups they took, the prompts trained ahead of
        the loader's position (a checkpoint's ``trained_ahead``)."""
        self.pool.version = step
        self.started = step * self.batch_size
        self.limit = total_steps * self.batch_size
        base = self.next_ordinal()
        self.skip = {base + offset for offset in self.loader.trained_ahead}
        self.clock_mark = self.pool.engine_seconds()

    def take(self, timer: Timer, *, generate_next: bool) -> tuple[Scored, int]:
        """The first ``trainBatchSize`` groups ready within the staleness bound, scored, and the newest epoch among
        them. ``generate_next`` False: this is the last step, nothing more is started."""
        with timer("gen_wait"):
            while True:
                with self.cond:
                    if self.failure is not None:
                        raise self.failure
                    self.drop_stale()
                    if len(self.ready) >= self.batch_size:
                        depth = len(self.ready)
                        taken, self.ready = self.ready[: self.batch_size], self.ready[self.batch_size :]
                        self.record_trained([r.group.ordinal for r in taken])
                        self.admitting = generate_next
                        metrics = self.step_metrics(depth, taken)
                        self.cond.notify_all()
                        break
                    self.cond.wait(POLL_SECONDS * 4)
                self.pool.admit_if_empty()
                self.pool.check_not_empty_too_long()
        return self.batch(taken, metrics), max(r.group.epoch for r in taken)

    def record_trained(self, ordinals: list[int]) -> None:
        """Under the lock: this step takes the groups of these ordinals (its checkpoint counts them trained)."""
        self.trained.update(ordinals)
        self.untrained.difference_update(ordinals)

    def drop_stale(self) -> None:
        """Regenerate the ready groups the next step may not train (under the lock)."""
        stale = [r for r in self.ready if self.pool.version - r.version > self.k]
        for ready in stale:
            self.ready.remove(ready)
            self.regenerate(ready.group)
            self.counters.dropped += 1

    def step_metrics(self, depth: int, taken: list[Ready]) -> dict[str, float]:
        clock = self.pool.engine_seconds()
        active, idle = (now - mark for now, mark in zip(clock, self.clock_mark, strict=True))
        metrics = {
            "rollout/queue_depth": float(depth),
            "rollout/in_flight_groups": float(sum(len(c.fresh) for c in self.chunks.values()) + len(self.unfinished)),
            "rollout/dropped_groups": float(self.counters.dropped),
            "rollout/lost_groups": float(self.counters.lost),
            "rollout/interrupted_samples": float(sum(r.interrupted for r in taken)),
            "rollout/engine_idle_fraction": idle / active if active > 0 else 0.0,
        }
        self.clock_mark, self.counters = clock, Counters()
        return metrics

    def batch(self, taken: list[Ready], metrics: dict[str, float]) -> Scored:
        keys = sorted({k for r in taken for k in r.extra})
        nan = torch.full((self.n,), float("nan"))
        return Scored(
            rows=concat([r.rows for r in taken], self.pad_id),
            samples=[r.group.prompt for r in taken for _ in range(self.n)],
            group_ids=torch.arange(len(taken)).repeat_interleave(self.n),
            scores=torch.cat([r.scores for r in taken]),
            extra={k: torch.cat([r.extra.get(k, nan) for r in taken]) for k in keys},
            metrics=metrics,
        )

    def resume_position(self) -> dict[str, Any]:
        """The loader position a checkpoint keeps: the batch of the oldest prompt not trained yet (the loader's next
        one when every prompt drawn was trained), and the offsets from there of the prompts trained already, those
        this run was to skip and has not drawn yet included."""
        with self.cond:
            oldest = min(self.untrained) if self.untrained else self.next_ordinal()
            start = oldest // self.batch_size * self.batch_size
            self.trained = {o for o in self.trained if o >= start}
            epoch, batch_in_epoch = divmod(start // self.batch_size, len(self.loader))
            return {
                "epoch": epoch,
                "batch_in_epoch": batch_in_epoch,
                "trained_ahead": sorted(o - start for o in self.trained | self.skip),
            }

    def next_ordinal(self) -> int:
        """The place in the loader's order of the next prompt the loader gives."""
        position = self.loader.state_dict()
        return (position["epoch"] * len(self.loader) + position["batch_in_epoch"]) * self.batch_size

    def close(self) -> None:
        """Stop the producer (its generations in flight are left to the engines, which the cluster stops)."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join()

    # --- the producer thread --------------------------------------------------------------------------------------

    def produce(self) -> None:
        try:
            while not self.stopping.is_set():
                self.pool.refresh()
                self.collect()
                self.dispatch()
        except BaseException as exc:  # the driver raises it from take()
            with self.cond:
                self.failure = exc
                self.cond.notify_all()

    def dispatch(self) -> None:
        """Give every idle engine a chunk: stopped responses first, then prompts within the staleness bound."""
        while True:
            engine = self.pool.acquire()
            if engine is None:
                return
            with self.cond:
                chunk = self.next_chunk(engine)
            if chunk is None:
                self.pool.release(engine)
                return
            call = self.call(chunk)
            with self.cond:
                self.chunks[call] = chunk

    def next_chunk(self, engine: PoolEngine) -> Chunk | None:
        """Under the lock: work for ``engine``, about one engine's share of a batch, or None."""
        groups = math.ceil(self.batch_size / max(self.pool.size, 1))
        chunk = Chunk(engine)
        for unfinished in list(self.unfinished):
            if unfinished.in_flight or unfinished.stopped_at >= self.pool.version:
                continue
            if self.pool.version - unfinished.version > self.k:  # too old to be trained: regenerate it
                self.unfinished.remove(unfinished)
                self.regenerate(unfinished.group)
                self.counters.dropped += 1
                continue
            stopped = [i for i, r in enumerate(unfinished.responses) if not r.finished]
            chunk.continued += [(unfinished, i) for i in stopped]
            unfinished.in_flight = len(stopped)
            if len(chunk.continued) >= groups * self.n:
                break
        if chunk.continued:
            return chunk
        while len(chunk.fresh) < groups and self.admits():
            if not self.todo:
                self.draw()
                continue
            chunk.fresh.append(self.todo.popleft())
            self.started += 1
        return chunk if chunk.fresh else None

    def admits(self) -> bool:
        """One more group may start: within the staleness bound and the run's groups."""
        bound = (self.pool.version + self.k + 1) * self.batch_size
        return self.admitting and self.started < min(bound, self.limit)

    def draw(self) -> None:
        """The loader's next batch into ``todo``, less the prompts a resumed run trained already."""
        base = self.next_ordinal()
        prompts = self.loader.next_batch()
        for i, prompt in enumerate(prompts):
            if base + i in self.skip:
                self.skip.discard(base + i)
                self.trained.add(base + i)
            else:
                self.todo.append(Group(prompt, base + i, self.loader.epoch))
                self.untrained.add(base + i)

    def regenerate(self, group: Group) -> None:
        """Under the lock: ``group`` is generated again from its prompt, before anything new."""
        self.todo.appendleft(group)
        self.started -= 1

    def call(self, chunk: Chunk) -> Any:
        sampling = self.sampling.kwargs()
        if chunk.fresh:
            return chunk.engine.handle.generate.remote([g.prompt.input_ids for g in chunk.fresh], self.n, sampling)
        budget = self.sampling.max_new_tokens
        contexts = [u.group.prompt.input_ids + u.responses[i].tokens for u, i in chunk.continued]
        longest = max(budget - len(u.responses[i].tokens) for u, i in chunk.continued)
        return chunk.engine.handle.generate.remote(contexts, 1, {**sampling, "max_new_tokens": max(longest, 1)})

    def collect(self) -> None:
        """Take in the generations that came back; an engine that died has its chunk generated again."""
        import ray

        with self.cond:
            calls = list(self.chunks)
        if not calls:
            time.sleep(POLL_SECONDS)
            return
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=POLL_SECONDS, fetch_local=False)
        for call in done:
            with self.cond:
                chunk = self.chunks.pop(call)
            self.pool.release(chunk.engine)
            try:
                rows = ray.get(call)
            except ray.exceptions.RayActorError as exc:
                self.pool.lose(chunk.engine, f"it died while generating: {type(exc).__name__}")
                self.repeat(chunk)
                continue
            self.receive(chunk, rows)

    def repeat(self, chunk: Chunk) -> None:
        """The groups of a lost chunk are generated again from their prompts."""
        with self.cond:
            groups = list(chunk.fresh)
            for unfinished in {id(u): u for u, _ in chunk.continued}.values():
                if unfinished in self.unfinished:
                    self.unfinished.remove(unfinished)
                    groups.append(unfinished.group)
            for group in reversed(groups):
                self.regenerate(group)
            self.counters.lost += len(groups)

    def receive(self, chunk: Chunk, rows: Rows) -> None:
        responses = split_responses(rows)
        complete: list[tuple[Group, list[Response]]] = []
        with self.cond:
            if chunk.fresh:
                for g, group in enumerate(chunk.fresh):
                    mine = responses[g * self.n : (g + 1) * self.n]
                    if all(r.finished for r in mine):
                        complete.append((group, mine))
                    else:
                        self.unfinished.append(Unfinished(group, mine, stopped_at=mine[0].version))
            else:
                for (unfinished, i), continuation in zip(chunk.continued, responses, strict=True):
                    self.continue_response(unfinished, i, continuation)
                for unfinished in {id(u): u for u, _ in chunk.continued}.values():
                    done = unfinished.in_flight == 0 and all(r.finished for r in unfinished.responses)
                    if done and unfinished in self.unfinished:
                        self.unfinished.remove(unfinished)
                        complete.append((unfinished.group, unfinished.responses))
        if complete:
            scored = self.score(complete)
            with self.cond:
                self.ready += scored
                self.cond.notify_all()

    def continue_response(self, unfinished: Unfinished, index: int, continuation: Response) -> None:
        """Under the lock: response ``index`` of ``unfinished`` grows by ``continuation``."""
        unfinished.responses[index] = grown = continued(
            unfinished.responses[index], continuation, self.sampling.max_new_tokens
        )
        unfinished.in_flight -= 1
        if not grown.finished:
            unfinished.stopped_at = max(unfinished.stopped_at, continuation.version)

    def score(self, complete: list[tuple[Group, list[Response]]]) -> list[Ready]:
        parts = [group_rows(group.prompt.input_ids, responses, self.pad_id) for group, responses in complete]
        rows = concat(parts, self.pad_id)
        scores, extra = self.scorer.score([g.prompt for g, _ in complete for _ in range(self.n)], rows)
        return [
            Ready(
                group=group,
                rows=part,
                scores=scores[i * self.n : (i + 1) * self.n],
                extra={k: v[i * self.n : (i + 1) * self.n] for k, v in extra.items()},
                version=min(r.version for r in responses),
                interrupted=sum(r.interrupted for r in responses),
            )
            for i, ((group, responses), part) in enumerate(zip(complete, parts, strict=True))
        ]


def split_responses(rows: Rows) -> list[Response]:
    """The engine's rows as responses: the tokens up to and including eos, their log-probs, the weights' version,
    and whether each ended (rows without ``finished`` did)."""
    lengths = rows["response_mask"].sum(-1).tolist()
    log_probs = rows.get("rollout_log_probs")
    finished = rows.get("finished")
    return [
        Response(
            tokens=rows["responses"][i, :length].tolist(),
            log_probs=log_probs[i, :length].tolist() if log_probs is not None else None,
            version=int(rows["weight_version"][i]),
            finished=bool(finished[i]) if finished is not None else True,
        )
        for i, length in enumerate(lengths)
    ]


def continued(response: Response, continuation: Response, budget: int) -> Response:
    """``response`` (stopped by a weight update) followed by ``continuation``, what an engine generated from the
    prompt and ``response``'s tokens, cut to ``budget`` tokens in all; each token keeps the log-prob of the weights
    that sampled it, the version stays the first token's."""
    room = budget - len(response.tokens)
    tokens = response.tokens + continuation.tokens[:room]
    log_probs = None
    if response.log_probs is not None and continuation.log_probs is not None:
        log_probs = response.log_probs + continuation.log_probs[:room]
    return replace(
        response,
        tokens=tokens,
        log_probs=log_probs,
        finished=continuation.finished or len(tokens) >= budget,
        interrupted=True,
    )


def group_rows(prompt: list[int], responses: list[Response], pad_id: int) -> Rows:
    """One group's rows as an engine would return them: the prompt left-padded, the responses right-padded."""
    prompts, prompt_mask = left_pad([prompt] * len(responses), pad_id)
    width = max(1, *(len(r.tokens) for r in responses))
    tokens = torch.full((len(responses), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.long)
    for i, r in enumerate(responses):
        tokens[i, : len(r.tokens)] = torch.tensor(r.tokens, dtype=torch.long)
        mask[i, : len(r.tokens)] = 1
    rows: Rows = {
        "prompts": prompts,
        "prompt_mask": prompt_mask,
        "responses": tokens,
        "response_mask": mask,
        "weight_version": torch.tensor([r.version for r in responses], dtype=torch.long),
    }
    if all(r.log_probs is not None for r in responses):
        log_probs = torch.zeros((len(responses), width), dtype=torch.float32)
        for i, r in enumerate(responses):
            log_probs[i, : len(r.tokens)] = torch.tensor(r.log_probs, dtype=torch.float32)
        rows["rollout_log_probs"] = log_probs
    return rows
