"""A rank of a worker group: process-group setup, threads, seeding, the micro-batch loops of forward-only passes and
updates (one optimizer step per mini-batch, losses as shares of the global mini-batch), and checkpoint shards."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from kuberl.api.spec import FSDP, Optim, RLJobSpec
from kuberl.trainer.model import fsdp
from kuberl.trainer.model.microbatch import (
    Rows,
    equalize,
    largest_first,
    micro_batches,
    num_rows,
    pad_right,
    select,
    trim,
)
from kuberl.trainer.observe.metrics import nvml_sampler
from kuberl.trainer.plan.execution import ExecutionPlan, MicroBatching
from kuberl.trainer.rollout.weight_sync import free_port

if TYPE_CHECKING:
    from transformers import PreTrainedModel


log = logging.getLogger(__name__)


@dataclass
class MicroLoss:
    """One micro-batch's loss (its share of the global mini-batch loss) and what the update reports of it."""

    loss: Tensor
    per_batch: dict[str, Tensor]
    """Detached scalars summed over the real micro-batches (e.g. losses, which are already shares). They stay on the
    device until the update ends: reading one back would stall the GPU before every backward."""
    per_token: dict[str, Tensor]
    """Detached scalars weighted by the micro-batch's valid response tokens (fractions such as clip ratios)."""
    outputs: dict[str, Tensor] = field(default_factory=dict)
    """Detached per-token ``(b, r)`` values the driver reads back after the update (:meth:`update_outputs`)."""


LossFn = Callable[[Rows, dict[str, float]], MicroLoss]
"""``(micro-batch on the host, mini-batch totals) -> MicroLoss``: what differs between the actor and the critic. It
packs the rows on the host and moves what it needs (:func:`~kuberl.trainer.model.microbatch.rows_to`)."""


class NonFiniteStepsError(RuntimeError):
    """``trainer.maxConsecutiveSkippedSteps`` optimizer steps in a row had a non-finite gradient norm."""


class DistributedWorker:
    """A rank of a worker group: process-group setup, threads, seeding, and the micro-batch loops."""

    role = "worker"
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    last_outputs: dict[str, Tensor]
    """See :meth:`update_outputs`."""
    skipped_in_a_row = 0
    """Optimizer steps skipped for a non-finite gradient norm since the last one taken."""

    def __init__(self, spec: RLJobSpec, plan: ExecutionPlan, rank: int) -> None:
        """``spec`` and ``plan``: the driver's objects, as Ray unpickled them."""
        logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {self.role}[{rank}] %(levelname)s %(message)s")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.spec = spec
        self.plan = plan
        self.rank = rank
        self.world_size = plan.ranks
        torch.set_num_threads(plan.threads)
        self.device = torch.device("cuda", 0) if self.spec.cluster.device == "cuda" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        seed = self.spec.data.seed * 1000 + rank
        torch.manual_seed(seed)
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed % 2**32)

    @property
    def compiles(self) -> bool:
        """Whether this rank's models run their decoder layers compiled (``model.compile``, CUDA only)."""
        return self.spec.model.compile and self.device.type == "cuda"

    def rendezvous(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def init_distributed(self, address: str, port: int) -> None:
        import torch.distributed as dist

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://{address}:{port}", rank=self.rank, world_size=self.world_size
        )

    def build_optimizer(self, optim: Optim, total_steps: int) -> None:
        self.optimizer = fsdp.make_optimizer(self.model, lr=optim.lr, weight_decay=optim.weight_decay)
        self.scheduler = fsdp.make_scheduler(
            self.optimizer,
            warmup_steps=optim.warmup_steps,
            total_steps=total_steps,
            kind=optim.scheduler,
            min_lr_ratio=optim.min_lr_ratio,
        )

    # --- micro-batch loops shared by actor and critic ---

    def micro_batch_indices(self, rows: Rows, micro: MicroBatching) -> list[list[int]]:
        """This rank's micro-batches, largest first, padded to the same count on every rank (FSDP collectives must
        pair up)."""
        import torch.distributed as dist

        bins = micro_batches(rows, micro_batch_size=micro.size, max_tokens=micro.max_tokens)
        if self.world_size == 1:
            return bins
        count = torch.tensor([len(bins)], device=self.device)  # NCCL reduces device tensors only
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return largest_first(rows, equalize(bins, int(count)))

    def forward_only(
        self, rows: Rows, fn: Callable[[Rows], dict[str, Tensor]], micro: MicroBatching
    ) -> dict[str, Tensor]:
        """Run ``fn`` over micro-batches without gradients and stitch the ``(b, r)`` outputs back to ``(B, R)``."""
        parts: list[tuple[list[int], dict[str, Tensor]]] = []
        with torch.no_grad():
            for idx in self.micro_batch_indices(rows, micro):
                result = fn(select(rows, idx or [0]))
                if idx:
                    parts.append((idx, result))
        return stitch(parts, rows)

    def train(
        self,
        mini_batches: list[Rows],
        totals: list[dict[str, float]],
        *,
        loss_fn: LossFn,
        micro: MicroBatching,
        grad_clip: float,
        offload: FSDP,
    ) -> dict[str, float]:
        """PPO epochs × mini-batches × micro-batches; one optimizer step per mini-batch, one scheduler step.

        ``totals[j]`` holds mini-batch ``j``'s valid response tokens and rows over all ranks, so each micro-batch
        loss is its share of the global mini-batch loss; FSDP averages gradients over ranks, so the loss is
        multiplied by the rank count before backward. Returns this rank's sums (``reduce_update_metrics``).
        """
        sums: dict[str, float] = {}
        device_sums: dict[str, Tensor] = {}
        grad_norms = []
        self.last_outputs = {}
        with self.optimizer_offloaded(offload):
            self.model.train()
            for _ in range(self.spec.batch.ppo_epochs):
                for rows, total in zip(mini_batches, totals, strict=True):
                    bins = self.micro_batch_indices(rows, micro)
                    self.optimizer.zero_grad(set_to_none=True)
                    sums["micro_batches"] = sums.get("micro_batches", 0.0) + len(bins)
                    outputs: list[tuple[list[int], dict[str, Tensor]]] = []
                    for i, idx in enumerate(bins):
                        fsdp.set_gradient_sync(self.model, i == len(bins) - 1)
                        mb = trim(select(rows, idx or [0]))
                        weight = 1.0 if idx else 0.0  # an empty micro-batch only pairs up FSDP collectives
                        n_tok = float(mb["response_mask"].sum()) * weight
                        out = loss_fn(mb, total)
                        (out.loss * self.world_size * weight).backward()
                        sums["tokens"] = sums.get("tokens", 0.0) + n_tok
                        for key, value in out.per_batch.items():
                            device_sums[key] = device_sums.get(key, 0.0) + weight * value.float()
                        for key, value in out.per_token.items():
                            device_sums[key] = device_sums.get(key, 0.0) + n_tok * value.float()
                        if idx and out.outputs:
                            outputs.append((idx, out.outputs))
                    grad_norms.append(self.optimizer_step(grad_clip))
                    self.last_outputs = stitch(outputs, rows)
            self.scheduler.step()
        if device_sums:
            sums.update(zip(device_sums, torch.stack(list(device_sums.values())).tolist(), strict=True))
        return {
            **sums,
            "updates": float(len(grad_norms)),
            "skipped_steps": float(sum(not math.isfinite(n) for n in grad_norms)),
            "grad_norm": sum(grad_norms) / max(1, len(grad_norms)),
            "lr": self.optimizer.param_groups[0]["lr"],
        }

    def update_outputs(self) -> dict[str, Tensor]:
        """The :attr:`MicroLoss.outputs` of the last mini-batch of the last :meth:`train`, ``(b, R)`` each, in the
        order of that mini-batch's rows."""
        return self.last_outputs

    def optimizer_offloaded(self, options: FSDP) -> AbstractContextManager[None]:
        """fsdp.optimizerOffload around an update; with paramOffload the state already lives on the CPU."""
        offload = options.optimizer_offload and not options.param_offload and self.device.type == "cuda"
        return fsdp.optimizer_state_on(self.optimizer, self.device, offload)

    def optimizer_step(self, grad_clip: float) -> float:
        """Step unless the gradient norm (the same on every rank) is not finite; fail after
        ``trainer.maxConsecutiveSkippedSteps`` skips in a row: a run that only skips is not training."""
        norm = fsdp.clip_grad_norm(self.model, grad_clip)
        self.optimizer_skip_or_step(norm)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def optimizer_skip_or_step(self, norm: float) -> None:
        if math.isfinite(norm):
            self.optimizer.step()
            self.skipped_in_a_row = 0
            return
        self.skipped_in_a_row += 1
        limit = self.spec.trainer.max_consecutive_skipped_steps
        log.warning("non-finite gradient norm %s: optimizer step skipped (%d in a row)", norm, self.skipped_in_a_row)
        if self.skipped_in_a_row >= limit:
            raise NonFiniteStepsError(
                f"{self.role}: {self.skipped_in_a_row} optimizer steps in a row had a non-finite gradient norm "
                f"({norm}) and were skipped (trainer.maxConsecutiveSkippedSteps = {limit}); the loss or the "
                "gradients diverged: check the rewards and advantages, lower the learning rate, or train in a wider "
                "dtype"
            )

    # --- checkpoints ---

    def save_checkpoint(self, folder: str) -> None:
        from kuberl.trainer.checkpoint.shards import save_sharded

        save_sharded(folder, rank=self.rank, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)

    def load_checkpoint(self, folder: str, step: int) -> None:
        """``step``: the step the checkpoint was saved at (the version of the weights it holds)."""
        from kuberl.trainer.checkpoint.shards import load_sharded

        load_sharded(folder, rank=self.rank, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)


def load_trainer_model(path: str) -> PreTrainedModel:
    """A causal LM for the trainer's passes: float32 master weights, attention over packed rows."""
    from kuberl.trainer.model.attention import use_varlen_attention
    from kuberl.trainer.model.loading import load_causal_lm

    model = load_causal_lm(path, torch.float32)
    use_varlen_attention(model)
    return model


def stitch(parts: list[tuple[list[int], dict[str, Tensor]]], rows: Rows) -> dict[str, Tensor]:
    """Per-micro-batch ``(b, r)`` outputs (micro-batch row indices, outputs) back to ``(B, R)`` rows of ``rows``
    on the CPU, 0 at padding and for rows no part covers."""
    if not parts:
        return {}
    width = rows["responses"].shape[1]
    index = torch.as_tensor([i for idx, _ in parts for i in idx])
    stitched: dict[str, Tensor] = {}
    for key in parts[0][1]:
        values = torch.cat([pad_right(result[key].detach().float(), width, 0.0) for _, result in parts])
        stitched[key] = torch.zeros(num_rows(rows), width)
        stitched[key][index] = values.cpu()  # one copy to the host per output, not one per micro-batch
    return stitched


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def device_stats(device: torch.device) -> dict[str, float]:
    """torch's peak allocated memory (GPU), its allocator's retries after freeing its cache and, when ``pynvml`` is
    importable, NVML utilisation (mean over the step) and memory in use (largest over the step, and now)."""
    stats: dict[str, float] = {}
    if device.type != "cuda":
        return stats
    stats["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    stats["max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 2**30
    # > 0: the caching allocator met the card's limit and freed its cache to go on, so the card's peak is the card's
    allocator = torch.cuda.memory_stats(device)
    stats["alloc_retries"] = float(allocator.get("num_alloc_retries", 0))
    # the reserve split: free pieces of segments that also hold live blocks (fragmentation), at their largest
    stats["max_inactive_split_gb"] = allocator.get("inactive_split_bytes.all.peak", 0) / 2**30
    try:
        import pynvml

        pynvml.nvmlInit()
        index = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        # over the step from background samplers, not one reading at its end
        utilization = nvml_sampler(index, "utilization").take()
        if utilization is not None:
            stats["utilization"] = utilization.mean
        memory = nvml_sampler(index, "memory_used").take()
        if memory is not None:
            stats["memory_used_peak_gb"] = memory.max / 2**30
        stats["memory_used_gb"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
    except Exception:  # pynvml missing or NVML unavailable: memory from torch is still reported
        pass
    return stats


# --- groups ----------------------------------------------------------------------------------------------------


def reduce_update_metrics(results: list[dict[str, float]], role: str) -> dict[str, float]:
    """Per-rank sums → verl's metrics: losses are sums of global shares (summed over ranks, averaged over
    optimizer steps); fractions are token-weighted."""
    total = {k: sum(r.get(k, 0.0) for r in results) for k in results[0]}
    updates = max(1.0, results[0]["updates"])
    tokens = max(1.0, total["tokens"])
    out = {f"{role}/grad_norm": results[0]["grad_norm"], f"{role}/lr": results[0]["lr"]}
    out[f"{role}/skipped_steps"] = results[0].get("skipped_steps", 0.0)  # the same on every rank
    if role == "actor":
        out["actor/pg_loss"] = total["pg_loss"] / updates
        for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
            out[f"actor/{key}"] = total[key] / tokens
        if "kl_loss" in total:
            out["actor/kl_loss"] = total["kl_loss"] / updates
        out["actor/micro_batches"] = results[0]["micro_batches"] / updates
    else:
        out["critic/vf_loss"] = total["vf_loss"] / updates
        out["critic/vf_clipfrac"] = total["vf_clipfrac"] / tokens
    return out
