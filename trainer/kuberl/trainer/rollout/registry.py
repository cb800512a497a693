"""The rollout engines, by the name ``rollout.engine`` takes: each declares what it can do (its
:class:`~kuberl.api.engines.EngineCapabilities`, the entry admission reads) and how it is made, colocated in a
trainer rank and separate in Ray actors of its own. The plan, the cluster and the workers ask this registry;
nothing else branches on an engine's name.

Adding an engine: a module with its :class:`~kuberl.trainer.rollout.base.ColocatedRollout` (and, if it can run
separate, a Ray actor class with ``ready()``, ``generate(prompts, n, sampling) -> rows`` and the weight methods of
its transport), plus one :func:`register_engine` call, here for an engine the images ship or in the code that
uses it (tests/trainer/test_engine_registry.py registers a toy engine and trains with it through ``kuberl run``).
Factories import their module when called: vLLM is imported only where it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kuberl.api.engines import ENGINES, EngineCapabilities, Transport, declare_engine
from kuberl.trainer.plan.execution import EngineArgs
from kuberl.trainer.rollout.base import ColocatedRollout


@dataclass(frozen=True)
class EngineContext:
    """What an engine learns from the process that makes it (not from the spec)."""

    pad_id: int
    eos_ids: list[int]
    device: torch.device
    """The trainer rank's device (colocated), or the engine actor's."""
    threads: int
    """torch threads of a CPU engine's process."""


@dataclass(frozen=True)
class SeparateEngine:
    """How to start one separate engine: ``actor_class(model_path, pad_id=…, seed=seed + i, **kwargs)`` as a Ray
    actor with ``actor_options`` besides its placement (:class:`~kuberl.trainer.rollout.engine_pool.EnginePool`)."""

    actor_class: type
    kwargs: dict[str, Any]
    actor_options: dict[str, Any] = field(default_factory=dict)


ColocatedFactory = Callable[[EngineArgs, EngineContext], ColocatedRollout]
SeparateFactory = Callable[[EngineArgs, EngineContext, Transport], SeparateEngine]


@dataclass(frozen=True)
class Engine:
    name: str
    title: str
    """How the console names it ("vLLM")."""
    capabilities: EngineCapabilities
    colocated: ColocatedFactory | None
    """None when it cannot run inside a trainer rank (``capabilities.colocated`` false)."""
    separate: SeparateFactory | None
    """None when it cannot run in actors of its own (``capabilities.separate_devices`` empty)."""

    def make_colocated(self, args: EngineArgs, context: EngineContext) -> ColocatedRollout:
        if self.colocated is None:
            raise ValueError(f"rollout engine {self.name!r} cannot run colocated (rollout.placement separate)")
        return self.colocated(args, context)

    def make_separate(self, args: EngineArgs, context: EngineContext, transport: Transport) -> SeparateEngine:
        if self.separate is None:
            raise ValueError(f"rollout engine {self.name!r} cannot run separate (rollout.placement colocated)")
        return self.separate(args, context, transport)


REGISTRY: dict[str, Engine] = {}


def register_engine(engine: Engine) -> None:
    """Add an engine: its factories here, its capabilities in the API's table (admission reads them there)."""
    if (engine.colocated is None) == engine.capabilities.colocated:
        raise ValueError(f"engine {engine.name!r}: a colocated factory exactly when capabilities.colocated")
    if (engine.separate is None) == bool(engine.capabilities.separate_devices):
        raise ValueError(f"engine {engine.name!r}: a separate factory exactly when capabilities.separate_devices")
    if engine.name in REGISTRY:
        raise ValueError(f"rollout engine {engine.name!r} is registered already")
    if ENGINES.get(engine.name) not in (None, engine.capabilities):
        raise ValueError(f"rollout engine {engine.name!r} is declared in kuberl.api.engines with other capabilities")
    if engine.name not in ENGINES:
        declare_engine(engine.name, engine.capabilities)
    REGISTRY[engine.name] = engine


def engine(name: str) -> Engine:
    """The entry of ``rollout.engine``: the driver looks it up and hands it to the processes that make the engine
    (Ray pickles its factories by reference), so an engine registered only in the driver's process works too."""
    found = REGISTRY.get(name)
    if found is None:
        raise ValueError(f"rollout engine {name!r} has no factories in this process; registered: {', '.join(REGISTRY)}")
    return found


# --- the builtin engines -----------------------------------------------------------------------------------------


def hf_colocated(args: EngineArgs, context: EngineContext) -> ColocatedRollout:
    """A plain copy of the policy in the rank's process, in the dtype its forward passes run in."""
    from kuberl.trainer.model.fsdp import compute_dtype
    from kuberl.trainer.model.loading import load_causal_lm
    from kuberl.trainer.rollout.hf import HFRollout

    return HFRollout(
        load_causal_lm(args.model_path, compute_dtype(args.dtype, context.device.type)),
        pad_id=context.pad_id,
        eos_ids=context.eos_ids,
        calculate_log_probs=args.calculate_log_probs,
        max_batch_size=args.max_num_seqs,
        device=context.device,
    )


def hf_separate(args: EngineArgs, context: EngineContext, transport: Transport) -> SeparateEngine:
    from kuberl.trainer.rollout.hf import HFEngineActor

    kwargs = {
        "eos_ids": context.eos_ids,
        "threads": context.threads,
        "calculate_log_probs": args.calculate_log_probs,
        "max_batch_size": args.max_num_seqs,
        "partial_rollouts": args.partial_rollouts,
    }
    return SeparateEngine(HFEngineActor, kwargs, dict(HFEngineActor.ACTOR_OPTIONS))


def vllm_colocated(args: EngineArgs, context: EngineContext) -> ColocatedRollout:
    """An engine on the rank's GPU with dummy weights, which the first weight sync replaces."""
    try:
        from kuberl.trainer.rollout.vllm import VLLMRollout
    except ImportError as exc:
        raise RuntimeError(
            "rollout.engine vllm needs the GPU image (pip install 'kuberl[gpu]') and the vllm backend module; use "
            f"rollout.engine hf on CPU ({exc})"
        ) from exc
    return VLLMRollout(model_path=args.model_path, pad_id=context.pad_id, eos_ids=context.eos_ids, **args.kwargs())


def vllm_separate(args: EngineArgs, context: EngineContext, transport: Transport) -> SeparateEngine:
    from kuberl.trainer.rollout.vllm import VLLMEngineActor

    kwargs = {k: v for k, v in args.kwargs().items() if k != "seed"}  # the group gives engine i seed + i
    kwargs |= {"eos_ids": context.eos_ids, "weight_transfer": transport, "partial_rollouts": args.partial_rollouts}
    options = dict(VLLMEngineActor.PARTIAL_ACTOR_OPTIONS) if args.partial_rollouts else {}
    return SeparateEngine(VLLMEngineActor, kwargs, options)


register_engine(Engine("vllm", "vLLM", ENGINES["vllm"], vllm_colocated, vllm_separate))
register_engine(Engine("hf", "hf", ENGINES["hf"], hf_colocated, hf_separate))
