"""The separate rollout's engines seen from the driver: Ray actors of one engine class (vLLM on GPUs,
:class:`~kuberl.trainer.rollout.hf.HFEngineActor` on CPU), placed by
:func:`~kuberl.trainer.plan.layout.engine_actor_options`. Weights reach them from the trainer ranks
(:mod:`kuberl.trainer.rollout.weight_sync`), not through the driver.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kuberl.trainer.rollout.base import Rollout, RolloutBatch


class EngineGroup(Rollout):
    """Prompts are split evenly over the engines (whole prompts, so a GRPO group stays on one engine) and the
    batches concatenated in prompt order. An engine actor has ``generate(prompts, n, sampling) -> rows`` and
    ``ready()``."""

    def __init__(self, engines: Sequence[Any], *, pad_id: int) -> None:
        if not engines:
            raise ValueError("a separate rollout needs at least one engine")
        self.engines = list(engines)
        self.pad_id = pad_id

    @classmethod
    def spawn(
        cls,
        actor_class: type,
        actor_options: Sequence[dict[str, Any]],
        model_path: str,
        *,
        pad_id: int,
        seed: int = 0,
        **kwargs: Any,
    ) -> EngineGroup:
        """One ``actor_class`` actor per entry of ``actor_options`` (Ray options: GPUs, placement); engine ``i``
        samples with seed ``seed + i``. Waits until every engine is up."""
        import ray

        remote: Any = ray.remote(actor_class)
        engines: list[Any] = [  # Ray actor handles
            remote.options(**options).remote(model_path, pad_id=pad_id, seed=seed + i, **kwargs)
            for i, options in enumerate(actor_options)
        ]
        ray.get([e.ready.remote() for e in engines])
        return cls(engines, pad_id=pad_id)

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
        import ray

        from kuberl.trainer.model.microbatch import concat

        share = math.ceil(len(prompts) / len(self.engines))
        sampling = {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "max_new_tokens": max_new_tokens,
            "stop": stop,
        }
        parts = [
            e.generate.remote(prompts[i * share : (i + 1) * share], n, sampling)
            for i, e in enumerate(self.engines)
            if prompts[i * share : (i + 1) * share]
        ]
        rows = ray.get(parts)
        return RolloutBatch.from_rows(rows[0] if len(rows) == 1 else concat(rows, self.pad_id))

    def kill(self) -> None:
        import ray

        for engine in self.engines:
            ray.kill(engine)
