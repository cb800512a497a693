"""The ``vllm`` rollout: vLLM's offline ``LLM`` engine behind the :class:`Rollout` interface.

Two placements (``spec.rollout.placement``):

- ``colocated``: the engine runs inside the actor worker's process, on the worker's GPU (vLLM's engine core
  in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, sleep mode on). Between rollouts it sleeps at level 2 (weights
  and KV cache released; the FSDP actor has the GPU to itself) and :meth:`VLLMRollout.update_weights` wakes the
  weight memory, streams the new weights in buckets into vLLM's ``load_weights`` and leaves the KV cache asleep
  until :meth:`VLLMRollout.wake` (or the next ``generate``). When ``torch.distributed`` is already initialised by
  the trainer, the engine joins it through vLLM's ``external_launcher`` executor: with tensorParallelSize 1 every
  rank is an independent engine over its own prompts.
- ``separate``: engines (:class:`SeparateVLLMEngine`) run in their own Ray actors (:class:`VLLMEngineActor`), on the rollout pool's GPUs or
  sharing the trainer's (:mod:`kuberl.trainer.plan.layout`); the driver fans prompts out over them
  (:class:`~kuberl.trainer.rollout.engine_pool.EnginePool`) and the trainer sends new weights over NCCL or CUDA IPC
  (:class:`kuberl.trainer.rollout.weight_sync.WeightBroadcaster`). They never sleep.

Rollout log-probs (``rollout.calculateLogProbs``) are vLLM's ``processed_logprobs`` of the sampled tokens: the
log-softmax after temperature (and top-k/top-p, which renormalise over the kept tokens), i.e. the log-probability
of the distribution that was actually sampled. The trainer's old log-probs divide the logits by the same
temperature, so ``training/rollout_probs_diff_*`` compares like with like when top-k/top-p are off.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from kuberl.trainer.rollout.base import ColocatedRollout, RolloutBatch, left_pad, response_mask_from_eos
from kuberl.trainer.rollout.direct_load import LoadPlan, LoadRecorder
from kuberl.trainer.rollout.weight_sync import (
    DEFAULT_BUCKET_MB,
    VLLM_TRANSPORTS,
    Bucket,
    bucketed,
    flatten,
    rollout_named_tensors,
)

LOGPROBS_MODE = "processed_logprobs"
logger = logging.getLogger(__name__)

# vLLM reads these when the engine is built; set them before importing it (a user's own value wins).
_ENGINE_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not in the offline bundle (docs/gpu.md)
    "VLLM_NO_USAGE_STATS": "1",
}
_IN_PROCESS_ENV = {
    # engine core in this process: apply_model reaches the model directly, and CUDA IPC handles reach the weight
    # loader without crossing another process boundary
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # apply_model with a callable, should a multiprocess engine be used
}


def _set_env(values: dict[str, str]) -> None:
    for key, value in values.items():
        os.environ.setdefault(key, value)


def model_folder(path: str) -> str:
    """A Hugging Face folder vLLM can load for any ``model.path`` the trainer accepts.

    ``tiny://`` models are materialised once (seeded weights, so every rank writes the same files) under the
    kuberl cache; everything else goes through ``loading.resolve`` (GGUF conversion, the ``smollm2`` alias).
    """
    from kuberl.trainer.model import loading

    source = loading.resolve(path)
    if not source.startswith(loading.TINY_SCHEME):
        return source
    import hashlib

    spec = loading.parse_tiny(source)
    target = loading.cache_dir() / "tiny" / hashlib.sha256(source.encode()).hexdigest()[:16]
    if not (target / "config.json").exists():
        from transformers import AutoModelForCausalLM

        model = loading.build_tiny(spec, AutoModelForCausalLM, torch.float32)
        staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        loading.save_hf(model.state_dict(), model.config, loading.tiny_tokenizer(), str(staging))
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    return str(target)


def gpu_memory_in_use_gib() -> float:
    """Memory in use on the current GPU, by every process, in GiB (what ``nvidia-smi`` shows)."""
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


@dataclass
class Sample:
    """One sampled response: its tokens, their log-probs when asked for, and whether it ended (eos, a stop
    string or the token budget) rather than being stopped by an interrupt."""

    tokens: list[int]
    log_probs: list[float] | None
    finished: bool = True


class VLLMEngine:
    """One vLLM engine and its generation; the placements differ in how weights arrive and whether it sleeps
    (:class:`VLLMRollout` colocated, :class:`SeparateVLLMEngine`). ``model_path`` is anything ``loading.resolve``
    accepts; ``load_format="dummy"`` skips reading the checkpoint when the first weight update supplies the weights
    anyway."""

    in_process = True
    """Run vLLM's engine core in this process (weights reach the model without crossing a process boundary)."""
    _request_numbers: ClassVar[Iterator[int]] = itertools.count()
    """Request ids of interruptible generations, unique in the process."""

    def __init__(
        self,
        model_path: str,
        *,
        pad_id: int,
        eos_ids: Sequence[int],
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        enforce_eager: bool = False,
        calculate_log_probs: bool = False,
        dtype: str = "bfloat16",
        seed: int = 0,
        load_format: str = "auto",
        skip_tokenizer_init: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine vllm needs a CUDA GPU in this process; on CPU use rollout.engine hf")
        _set_env(_ENGINE_ENV)
        if self.in_process:
            _set_env(_IN_PROCESS_ENV)
        from vllm import LLM

        self.pad_id = pad_id
        self.eos_ids = [int(e) for e in eos_ids]
        self.calculate_log_probs = calculate_log_probs
        self.dtype = getattr(torch, dtype)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.folder = model_folder(model_path)

        kwargs: dict[str, Any] = dict(
            model=self.folder,
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            load_format=load_format,
            logprobs_mode=LOGPROBS_MODE,
            skip_tokenizer_init=skip_tokenizer_init,
            seed=seed,
            enable_prefix_caching=True,
        )
        kwargs.update(self.placement_kwargs(seed=seed, tensor_parallel_size=tensor_parallel_size))
        kwargs.update(engine_kwargs)
        self.llm = LLM(**kwargs)
        self.tied = bool(getattr(self.llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False))
        self._weights_stale = load_format == "dummy"

    def placement_kwargs(self, *, seed: int, tensor_parallel_size: int) -> dict[str, Any]:
        """The engine arguments this placement adds."""
        return {}

    # --- generation -------------------------------------------------------------------------------------------

    def sampling_params(
        self,
        n: int,
        *,
        temperature: float,
        top_p: float,
        top_k: int,
        max_new_tokens: int,
        logprobs: bool | None = None,
        stop: tuple[str, ...] = (),
    ) -> Any:
        from vllm import SamplingParams

        greedy = temperature == 0
        want_logprobs = self.calculate_log_probs if logprobs is None else logprobs
        return SamplingParams(
            n=1 if greedy else n,
            temperature=temperature,
            top_p=1.0 if greedy else top_p,
            top_k=0 if greedy or top_k < 0 else top_k,
            max_tokens=max_new_tokens,
            logprobs=0 if want_logprobs else None,
            flat_logprobs=True,  # lists per request, not a dict and a Logprob object per token (the GC's load)
            stop_token_ids=self.eos_ids,
            stop=list(stop) or None,
            include_stop_str_in_output=True,
            detokenize=bool(stop),  # stop strings are matched on the detokenized text
            skip_special_tokens=False,
            repetition_penalty=1.0,
        )

    @torch.no_grad()
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
        interrupt: threading.Event | None = None,
    ) -> RolloutBatch:
        """``n`` samples per prompt; greedy (``temperature`` 0) repeats each prompt ``n`` times (vLLM refuses
        ``n > 1`` for greedy sampling). ``interrupt``: once set, the requests still running stop after the engine
        step in progress, keeping what they sampled, and the batch says which rows had ended anyway
        (:attr:`RolloutBatch.finished`; partial rollouts)."""
        from vllm import TokensPrompt

        if not prompts:
            raise ValueError("generate needs at least one prompt")
        if self._weights_stale:
            raise RuntimeError(
                "the vLLM engine holds no weights (level-2 sleep or load_format dummy); call "
                "update_weights with the actor's weights before generate"
            )
        params = self.sampling_params(
            n, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, stop=stop
        )
        copies = n if params.n == 1 else 1
        requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts for _ in range(copies)]
        expanded = [p for p in prompts for _ in range(n)]
        if interrupt is not None:
            samples = self._generate_until(requests, params, interrupt)
            batch = self._to_batch(expanded, samples)
            batch.finished = torch.as_tensor([s.finished for s in samples])
            return batch
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        samples = [
            Sample(list(c.token_ids), self._log_probs(c) if self.calculate_log_probs else None)
            for out in outputs
            for c in sorted(out.outputs, key=lambda c: c.index)
        ]
        return self._to_batch(expanded, samples)

    def _generate_until(self, requests: list[Any], params: Any, interrupt: threading.Event) -> list[Sample]:
        """``LLM.generate`` runs every request to its end; this steps the engine itself, taking each request's new
        tokens as they come (vLLM's ``DELTA`` outputs), and aborts the requests still running once ``interrupt``
        is set. The samples in request order, each request's ``n`` by index."""
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        params.output_kind = RequestOutputKind.DELTA
        ids = [f"kuberl-{next(self._request_numbers)}" for _ in requests]
        samples = {
            (rid, i): Sample([], [] if self.calculate_log_probs else None, finished=False)
            for rid in ids
            for i in range(params.n)
        }
        for rid, request in zip(ids, requests, strict=True):
            engine.add_request(rid, request, params)
        running = set(ids)
        while engine.has_unfinished_requests():
            if interrupt.is_set():
                engine.abort_request(sorted(running))
                break
            for out in engine.step():
                for completion in out.outputs:
                    sample = samples[(out.request_id, completion.index)]
                    sample.tokens.extend(int(t) for t in completion.token_ids)
                    if sample.log_probs is not None:
                        sample.log_probs += self._log_probs(completion)
                    sample.finished = completion.finish_reason is not None
                if out.finished:
                    running.discard(out.request_id)
        return list(samples.values())

    @staticmethod
    def _log_probs(completion: Any) -> list[float]:
        """The log-probs of the tokens a vLLM ``CompletionOutput`` carries, asked for with ``logprobs=0`` and
        ``flat_logprobs``: vLLM's ``FlatLogprobs``, one entry per position, the sampled token's."""
        flat, tokens = completion.logprobs, list(completion.token_ids)
        if flat is None:
            raise RuntimeError("vLLM returned no log-probs although logprobs=0 was requested")
        if not tokens:  # a DELTA output without new tokens carries the request's whole list (vLLM slices it [-0:])
            return []
        if flat.token_ids != tokens:
            raise RuntimeError(
                f"vLLM's log-probs are of {len(flat.token_ids)} tokens, not of the {len(tokens)} sampled"
            )
        return list(flat.logprobs)

    def _to_batch(self, prompts: list[list[int]], samples: list[Sample]) -> RolloutBatch:
        if len(samples) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(samples)} samples for {len(prompts)} requested")
        ids, mask = left_pad(prompts, self.pad_id)
        width = max(1, max(len(s.tokens) for s in samples))
        responses = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        log_probs = torch.zeros((len(samples), width), dtype=torch.float32) if self.calculate_log_probs else None
        for i, sample in enumerate(samples):
            responses[i, : len(sample.tokens)] = torch.as_tensor(sample.tokens, dtype=torch.long)
            if log_probs is not None and sample.log_probs is not None:
                log_probs[i, : len(sample.tokens)] = torch.as_tensor(sample.log_probs, dtype=torch.float32)
        lengths = torch.as_tensor([len(s.tokens) for s in samples])
        generated = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
        response_mask = response_mask_from_eos(responses, self.eos_ids) * generated
        responses = responses.masked_fill(response_mask == 0, self.pad_id)
        if log_probs is not None:
            log_probs = log_probs * response_mask
        return RolloutBatch(ids, mask, responses, response_mask, log_probs)

    def shutdown(self) -> None:
        """Free the engine (tests and benchmarks that build several engines in one process)."""
        import gc

        llm = getattr(self, "llm", None)
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "engine_core"):
            with contextlib.suppress(Exception):
                engine.engine_core.shutdown()
        self.llm = None
        del llm, engine
        gc.collect()
        torch.cuda.empty_cache()


class VLLMRollout(VLLMEngine, ColocatedRollout):
    """The colocated engine: inside the actor rank's process, asleep while training runs, weights streamed in by
    :meth:`update_weights`."""

    def __init__(
        self, model_path: str, *, bucket_mb: int = DEFAULT_BUCKET_MB, sleep_level: int = 2, **kwargs: Any
    ) -> None:
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep level must be 1 (weights to CPU) or 2 (weights dropped), got {sleep_level}")
        self.bucket_bytes = bucket_mb * 1024 * 1024
        self.sleep_level = sleep_level
        self._asleep: set[str] = set()
        self.load_plan: LoadPlan | None = None
        """vLLM's first weight load, recorded and checked: later loads replay it (:mod:`.direct_load`)."""
        self.load_plan_refused: str | None = None
        """Why the first load's records could not be replayed (the loads keep vLLM's loader)."""
        super().__init__(model_path, **kwargs)

    def placement_kwargs(self, *, seed: int, tensor_parallel_size: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"enable_sleep_mode": True}
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # Join the trainer's process group instead of starting one (verl's arrangement): each rank's engine
            # is an "external data-parallel" replica; tensor-parallel ranks must pass identical prompts.
            rank = torch.distributed.get_rank()
            os.environ.setdefault("RANK", str(rank))
            os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device()))
            kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs["seed"] = seed + rank // tensor_parallel_size
        return kwargs

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
        interrupt: threading.Event | None = None,
    ) -> RolloutBatch:
        """Wakes the engine first (a no-op when awake)."""
        if not self._weights_stale:
            self.wake()
        return super().generate(
            prompts,
            n,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_new_tokens=max_new_tokens,
            stop=stop,
            interrupt=interrupt,
        )

    # --- weights ----------------------------------------------------------------------------------------------

    def replay_loads(self, plan: LoadPlan | None) -> None:
        """Later loads replay ``plan``; with None they go through vLLM's loader, unrecorded (how
        ``bench/weight_sync.py`` measures the two ways against each other on one engine)."""
        self.load_plan = plan
        self.load_plan_refused = None if plan is not None else "vLLM's loader chosen by replay_loads(None)"

    def load_bucket(self, bucket: Bucket, recorder: LoadRecorder | None = None) -> None:
        """One bucket of full tensors (HF names) into the engine's model, on the engine's GPU (vLLM's loader, its
        calls recorded by ``recorder``)."""
        if recorder is None:
            self.llm.apply_model(lambda model: model.load_weights(bucket))
        else:
            self.llm.apply_model(lambda model: recorder.load(model, bucket))

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load ``named_tensors`` into the engine; a sleeping engine wakes only its weight memory.

        The first load goes through vLLM's loader in buckets, recorded; when the records explain it
        (:mod:`~kuberl.trainer.rollout.direct_load`), later loads copy each tensor straight into its place. Either
        way ``named_tensors`` is consumed lazily, so a generator of FSDP gathers (``fsdp.full_named_parameters``)
        keeps at most one bucket of full tensors alive (one tensor on the direct path).
        """
        self._wake({"weights"})
        named = rollout_named_tensors(named_tensors, tied=self.tied)
        if self.load_plan is not None:
            self.load_plan.load(named)
        else:
            recorder = LoadRecorder() if self.load_plan_refused is None else None
            for bucket in bucketed(named, self.bucket_bytes):
                flat = flatten(bucket, dtype=self.dtype, device=self.device)  # one cast and copy per bucket
                del bucket
                self.load_bucket(flat.tensors(), recorder)
            if recorder is not None:
                self.load_plan = self.llm.apply_model(recorder.plan)[0]
                self.load_plan_refused = recorder.refused
                if recorder.refused is not None:
                    logger.warning("weight loads keep vLLM's loader: %s", recorder.refused)
        self._weights_stale = False
        if not self._asleep:
            self.llm.reset_prefix_cache()  # cached KV was computed with the old weights

    # --- memory -----------------------------------------------------------------------------------------------

    def sleep(self) -> None:
        """Release the engine's GPU memory (level 2: weights and KV cache dropped; level 1: weights to CPU)."""
        if self._asleep:
            return
        torch.cuda.synchronize()
        self.llm.sleep(level=self.sleep_level)
        self._asleep = {"weights", "kv_cache"}
        self._weights_stale = self.sleep_level == 2

    def wake(self) -> None:
        """Reacquire whatever :meth:`sleep` released. After a level-2 sleep the weights hold garbage until
        :meth:`update_weights`; waking first and loading after also works, with the KV cache resident meanwhile."""
        self._wake(set(self._asleep))

    def _wake(self, tags: set[str]) -> None:
        tags = tags & self._asleep
        if not tags:
            return
        # the engine allocates outside PyTorch's cache: give it the blocks the trainer's passes left cached (on an
        # 80 GB card the 1.1B update's cache left no room for the weights woken for the sync)
        torch.cuda.empty_cache()
        # weights before kv_cache: the KV cache goes last so the weight load has the most room
        for tag in ("weights", "kv_cache"):
            if tag in tags:
                self.llm.wake_up(tags=[tag])
                self._asleep.discard(tag)

    @property
    def needs_weights(self) -> bool:
        """True after a level-2 sleep (or a dummy load) until :meth:`update_weights` runs."""
        return self._weights_stale

    @property
    def asleep(self) -> bool:
        return bool(self._asleep)

    @property
    def pool_bytes(self) -> int:
        """The bytes of vLLM's sleep-mode allocations (weights, KV cache): they stay in PyTorch's counters while the
        engine sleeps, though their memory is released."""
        from vllm.device_allocator.cumem import CuMemAllocator

        return int(CuMemAllocator.get_instance().get_current_usage())


class SeparateVLLMEngine(VLLMEngine):
    """A separate engine (in a :class:`VLLMEngineActor`): it never sleeps, and the trainer ranks send it weights
    over NCCL or CUDA IPC (:class:`kuberl.trainer.rollout.weight_sync.WeightBroadcaster`)."""

    def __init__(self, model_path: str, *, weight_transfer: str = "nccl", **kwargs: Any) -> None:
        if weight_transfer not in VLLM_TRANSPORTS:
            raise ValueError(f"weight transfer {weight_transfer!r} is not one of {VLLM_TRANSPORTS}")
        self.weight_transfer = weight_transfer
        self.in_process = weight_transfer == "ipc"  # CUDA IPC handles must reach the weight loader directly
        super().__init__(model_path, **kwargs)

    def placement_kwargs(self, *, seed: int, tensor_parallel_size: int) -> dict[str, Any]:
        from vllm.config import WeightTransferConfig

        kwargs: dict[str, Any] = {"weight_transfer_config": WeightTransferConfig(backend=self.weight_transfer)}
        if tensor_parallel_size > 1:
            # inside a Ray actor vLLM would pick its Ray executor and ask Ray for GPUs this actor already holds
            kwargs["distributed_executor_backend"] = "mp"
        return kwargs

    # engine side of WeightBroadcaster.send: start, one update per buffer or broadcast, finish

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def receive_weights(self, update_info: dict[str, Any]) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self) -> None:
        self.llm.finish_weight_update()
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self._weights_stale = False


# --- separate placement -------------------------------------------------------------------------------------


class VLLMEngineActor:
    """A Ray actor holding one engine of a separate rollout (placed by :func:`layout.engine_actor_options`).

    With ``partial_rollouts`` it runs threaded (:data:`PARTIAL_ACTOR_OPTIONS`): a weight update arriving during a
    generation stops it after the engine step in progress (the batch returned says which rows had not finished);
    without, it runs one call at a time and the update waits for the generation."""

    PARTIAL_ACTOR_OPTIONS: ClassVar[dict[str, Any]] = {"max_concurrency": 2}
    """A weight update and a generation may arrive together: the update stops the generation rather than queue."""

    def __init__(self, model_path: str, *, partial_rollouts: bool = False, **kwargs: Any) -> None:
        self.rollout = SeparateVLLMEngine(model_path, **kwargs)
        self.weight_version = 0
        self.partial_rollouts = partial_rollouts
        self.engine_free = threading.Lock()
        """Held by a generation, or by a weight update from its start to its finish: vLLM's engine serves one
        thread at a time."""
        self.new_weights = threading.Event()
        """Set while a weight update waits for the generation in flight to stop."""

    def generate(self, prompts: list[list[int]], n: int, sampling: dict[str, Any]) -> dict[str, Tensor]:
        with self.engine_free:
            interrupt = self.new_weights if self.partial_rollouts else None
            batch = self.rollout.generate(prompts, n, **sampling, interrupt=interrupt)
            return batch.stamped(self.weight_version).as_rows()

    def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        self.rollout.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        if self.partial_rollouts:
            self.new_weights.set()
        self.engine_free.acquire()
        self.new_weights.clear()
        try:
            self.rollout.start_weight_update()
        except BaseException:
            self.engine_free.release()
            raise

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.rollout.receive_weights(update_info)

    def finish_weight_update(self, version: int) -> None:
        try:
            self.rollout.finish_weight_update()
            self.weight_version = version
        finally:
            self.engine_free.release()

    def ready(self) -> bool:
        """Answers once the engine is up (the constructor has loaded the model)."""
        return True
