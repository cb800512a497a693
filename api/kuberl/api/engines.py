"""What each rollout engine can do: the one table that admission (the rules in :mod:`kuberl.api.rules`, compiled into
the CRD and evaluated offline), the trainer's plan and its engine registry (``kuberl.trainer.rollout.registry``,
which adds each engine's factories) consult instead of branching on an engine's name.

It lives in the API because the API must not import the trainer: the trainer's registry declares an engine here
(:func:`declare_engine`) and refers to this entry. The CRD is generated with the builtin engines; an engine
declared at run time (a plugin, a test) is admitted by ``kuberl validate`` and ``kuberl run`` in that process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Device = Literal["cpu", "cuda"]
Transport = Literal["object_store", "nccl", "ipc"]
"""How separate engines receive the trainer's weights: through the Ray object store (CPU engines), an NCCL
broadcast from trainer rank 0, or CUDA IPC handles to each trainer rank's buffer (an engine sharing that GPU)."""


@dataclass(frozen=True)
class EngineCapabilities:
    devices: frozenset[Device]
    """The cluster.device values it runs on."""
    separate_devices: frozenset[Device]
    """Where it also runs in Ray actors of its own (rollout.placement separate); empty: colocated only."""
    colocated: bool
    """It runs inside each trainer rank's process, taking the rank's gathered weights and sleeping while the rank
    trains (rollout.placement colocated)."""
    transports: frozenset[Transport]
    """How it takes weights when separate."""
    tensor_parallel: bool
    """One engine may span several GPUs (rollout.tensorParallelSize above 1)."""
    log_probs: bool
    """It returns the log-probs of the tokens it sampled (rollout.calculateLogProbs)."""
    overlap: bool
    """Separate engines may generate the next batch while the trainer updates (rollout.overlap)."""
    partial_rollouts: bool
    """A generation in flight at a weight update can be interrupted and continued from its tokens with the new
    weights (rollout.partialRollouts)."""
    max_lora_rank: int | None
    """The largest LoRA rank its weights may carry; None: any."""


ENGINES: dict[str, EngineCapabilities] = {
    "vllm": EngineCapabilities(
        devices=frozenset({"cuda"}),
        separate_devices=frozenset({"cuda"}),
        colocated=True,
        transports=frozenset({"nccl", "ipc"}),
        tensor_parallel=True,
        log_probs=True,
        overlap=True,
        partial_rollouts=True,
        max_lora_rank=512,  # vLLM's max_lora_rank choices end at 512
    ),
    "hf": EngineCapabilities(
        devices=frozenset({"cpu", "cuda"}),
        separate_devices=frozenset({"cpu"}),  # separate GPU engines are vllm
        colocated=True,
        transports=frozenset({"object_store"}),
        tensor_parallel=False,  # one unsharded copy of the policy per engine
        log_probs=True,
        overlap=True,
        partial_rollouts=True,
        max_lora_rank=None,
    ),
}
"""Every engine, by the name ``rollout.engine`` takes."""

BUILTIN_ENGINES = tuple(ENGINES)
"""The engines the images ship: the CRD's enum of rollout.engine."""


def declare_engine(name: str, capabilities: EngineCapabilities) -> None:
    """Add an engine to the table (the trainer's registry does, for each engine it registers)."""
    if name in ENGINES:
        raise ValueError(f"rollout engine {name!r} is declared already; known: {', '.join(ENGINES)}")
    ENGINES[name] = capabilities


def check_engine_name(name: str) -> str:
    """rollout.engine's validator: a declared engine."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; known: {', '.join(ENGINES)}")
    return name


def engines_where(test: str) -> list[str]:
    """The engines whose capabilities pass ``test``, a predicate by name (see :data:`ENGINE_SETS`)."""
    return [name for name, caps in ENGINES.items() if ENGINE_SETS[test](caps)]


ENGINE_SETS: dict[str, Callable[[EngineCapabilities], bool]] = {
    "ENGINES_ON_CPU": lambda c: "cpu" in c.devices,
    "ENGINES_ON_CUDA": lambda c: "cuda" in c.devices,
    "COLOCATED_ENGINES": lambda c: c.colocated,
    "SEPARATE_ENGINES_ON_CPU": lambda c: "cpu" in c.separate_devices,
    "SEPARATE_ENGINES_ON_CUDA": lambda c: "cuda" in c.separate_devices,
    "TENSOR_PARALLEL_ENGINES": lambda c: c.tensor_parallel,
    "LOG_PROB_ENGINES": lambda c: c.log_probs,
    "OVERLAP_ENGINES": lambda c: c.overlap,
    "PARTIAL_ROLLOUT_ENGINES": lambda c: c.partial_rollouts,
}
"""The engine sets the rules name, each a predicate on the capabilities (rules.py turns each into a CEL list)."""
