"""Ray actor worker groups: one actor per rank, SPMD inside a group, driven by the single controller.

- :class:`ActorWorker` holds the FSDP2 policy, the frozen reference (a second FSDP2 model, or with LoRA the same
  model under ``disable_adapter()``) and either the colocated rollout engine or, with ``placement: separate``, the
  sending end of the weight transfer to the engines (:class:`kuberl.trainer.weight_sync.WeightBroadcaster`).
- :class:`CriticWorker` holds the value model: the policy's decoder (``AutoModelForCausalLM.<base_model_prefix>``)
  plus a fresh ``nn.Linear(hidden, 1)`` value head (zero-initialised, so the first values are 0). It is a small
  module of ours rather than ``AutoModelForTokenClassification`` because the tiny test models and GGUF-converted
  folders load as causal LMs, and the decoder weights then come from the same loader as the actor's.
- :class:`RewardModelWorker` scores texts with a sequence-classification reward model.

Placement: one placement group for the trainer pool with one bundle per rank (``{"CPU": 1, "GPU": 1}``, or
``{"CPU": 1}`` with ``cluster.device: cpu``); the actor, critic and reward-model actors of rank ``r`` share bundle
``r`` with fractional shares and take turns, as verl's colocated roles do (so does a separate rollout engine when
it shares the trainer's GPUs, but it does not take turns: it keeps its memory share). Each group has its own
``torch.distributed`` process group (gloo on CPU, NCCL on CUDA) whose rendezvous address rank 0 picks.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from kuberl.api.spec import FSDP, Optim, RLJobSpec
from kuberl.trainer import fsdp
from kuberl.trainer.metrics import nvml_sampler
from kuberl.trainer.microbatch import (
    Rows,
    equalize,
    micro_batches,
    num_rows,
    pack,
    pad_right,
    rows_to,
    select,
    trim,
)
from kuberl.trainer.plan import ExecutionPlan, MicroBatching, plan_execution
from kuberl.trainer.weight_sync import free_port

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kuberl.trainer.rollout import ColocatedRollout
    from kuberl.trainer.weight_sync import ObjectStoreSender, Transport, WeightBroadcaster

log = logging.getLogger(__name__)

FRACTION = {"actor": 0.4, "critic": 0.25, "reward_model": 0.15, "rollout": 0.2}
"""Share of a rank's bundle each role's actor requests; Ray only needs them to fit in one bundle together."""


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
packs the rows on the host and moves what it needs (:func:`~kuberl.trainer.microbatch.rows_to`)."""


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

    def __init__(self, spec_json: str, rank: int, world_size: int, threads: int, plan: ExecutionPlan) -> None:
        logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {self.role}[{rank}] %(levelname)s %(message)s")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.spec = RLJobSpec.model_validate_json(spec_json)
        self.plan = plan
        self.rank = rank
        self.world_size = world_size
        torch.set_num_threads(max(1, threads))
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
        """This rank's micro-batches, padded to the same count on every rank (FSDP collectives must pair up)."""
        import torch.distributed as dist

        bins = micro_batches(rows, micro_batch_size=micro.size, max_tokens=micro.max_tokens)
        if self.world_size == 1:
            return bins
        count = torch.tensor([len(bins)], device=self.device)  # NCCL reduces device tensors only
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return equalize(bins, int(count))

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
        from kuberl.trainer.checkpoint import save_sharded

        save_sharded(folder, rank=self.rank, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)

    def load_checkpoint(self, folder: str, step: int) -> None:
        """``step``: the step the checkpoint was saved at (the version of the weights it holds)."""
        from kuberl.trainer.checkpoint import load_sharded

        load_sharded(folder, rank=self.rank, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)


def load_trainer_model(path: str) -> PreTrainedModel:
    """A causal LM for the trainer's passes: float32 master weights, attention over packed rows."""
    from kuberl.trainer.attention import use_varlen_attention
    from kuberl.trainer.models import load_causal_lm

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


class ActorWorker(DistributedWorker):
    role = "actor"

    def init_model(self, total_steps: int) -> dict[str, Any]:
        from kuberl.trainer.models import load_tokenizer, num_params

        spec = self.spec
        self.tokenizer = load_tokenizer(spec.model.tokenizer_path or spec.model.path)
        model = load_trainer_model(spec.model.path)
        self.ref = None
        if self.plan.uses_reference and spec.model.lora is None:
            self.ref = fsdp.prepare(
                load_trainer_model(spec.model.path),
                gradient_checkpointing=False,
                compile_layers=self.compiles,
                reshard_after_forward=True,
                param_offload=spec.actor.fsdp.param_offload,
                trainable=False,
                device=self.device,
                dtype=spec.model.dtype,
            )
        params = num_params(model)
        self.build_policy(model, total_steps)
        eos_ids = sorted({self.tokenizer.eos_token_id, *_as_list(getattr(self.config, "eos_token_id", None))} - {None})
        self.broadcaster: WeightBroadcaster | ObjectStoreSender | None = None
        self.weight_version = 0
        """The trainer step of the weights the rollout engine(s) hold (0: the initial ones)."""
        self.rollout = self.build_rollout(eos_ids)
        if self.rollout is not None:
            self.sync_weights(0)
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)  # DTensor numel is global
        return {
            "params": params,
            "trainable_params": trainable,
            "pad_id": self.tokenizer.pad_token_id,
            "eos_ids": eos_ids,
        }

    def build_policy(self, model: PreTrainedModel, total_steps: int) -> None:
        """The trained policy from an fp32 ``model``: FSDP2 (with LoRA adapters when the spec asks), its optimizer
        and learning-rate schedule."""
        spec = self.spec
        self.config = model.config
        lora = spec.model.lora
        self.lora_scaling = lora.alpha / lora.rank if lora else None
        lora_args = {"rank": lora.rank, "alpha": lora.alpha, "target_modules": lora.target_modules} if lora else None
        self.model = fsdp.prepare(
            model,
            device=self.device,
            dtype=spec.model.dtype,
            gradient_checkpointing=spec.model.gradient_checkpointing,
            compile_layers=self.compiles,
            reshard_after_forward=spec.actor.fsdp.reshard_after_forward,
            param_offload=spec.actor.fsdp.param_offload,
            lora=lora_args,
        )
        self.build_optimizer(spec.actor.optim, total_steps)

    # --- rollout ---

    def build_rollout(self, eos_ids: list[int]) -> ColocatedRollout | None:
        """The colocated engine of this rank: ``hf`` gets a plain copy of the policy; ``vllm`` starts an engine on
        this rank's GPU with dummy weights that the first :meth:`sync_weights` replaces. None when the rollout is
        separate: the driver starts the engines and then calls :meth:`connect_rollout`."""
        from kuberl.trainer.models import load_causal_lm
        from kuberl.trainer.rollout import make_rollout

        if self.plan.rollout.separate:
            return None
        engine = self.plan.engine
        pad_id = self.tokenizer.pad_token_id
        if engine is not None:
            return make_rollout("vllm", model_path=engine.model_path, pad_id=pad_id, eos_ids=eos_ids, **engine.kwargs())
        spec = self.spec
        model = load_causal_lm(spec.model.path, fsdp.compute_dtype(spec.model.dtype, self.device.type))
        return make_rollout(
            "hf",
            model=model,
            pad_id=pad_id,
            eos_ids=eos_ids,
            calculate_log_probs=spec.rollout.calculate_log_probs,
            max_batch_size=spec.rollout.max_num_seqs,
            device=self.device,
        )

    def broadcast_group(self, engine_world_sizes: list[int]) -> Any:
        """Where the NCCL group of a separate rollout meets: on this rank's node (call it on rank 0)."""
        from kuberl.trainer.weight_sync import new_broadcast_group

        return new_broadcast_group(engine_world_sizes)

    def connect_rollout(self, engines: list[Any], transport: Transport, group: Any) -> None:
        """Join the weight transfer to the separate engines (on every rank; rank 0 blocks until they joined)."""
        from kuberl.trainer.weight_sync import ObjectStoreSender, WeightBroadcaster

        if transport == "object_store":
            self.broadcaster = ObjectStoreSender(engines, rank=self.rank)
        else:
            self.broadcaster = WeightBroadcaster(engines, rank=self.rank, transport=transport, group=group)

    def sync_weights(self, version: int) -> None:
        """Send the gathered full weights, the result of trainer step ``version``, to the rollout engine(s).

        Colocated, every rank streams into its own engine, whose KV cache stays asleep meanwhile (update_weights
        wakes only the weights), which keeps the peak memory down; separate, the ranks feed the broadcaster (the
        engines keep the version and stamp their batches with it).
        """
        if self.broadcaster is not None:
            self.broadcaster.send_fsdp(
                self.model,
                version=version,
                dtype=fsdp.compute_dtype(self.spec.model.dtype, self.device.type),
                lora_scaling=self.lora_scaling,
            )
        elif self.rollout is not None:
            self.rollout.update_weights(fsdp.full_named_parameters(self.model, lora_scaling=self.lora_scaling))
        self.weight_version = version
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def generate(self, prompts: list[list[int]], n: int, sampling: dict[str, Any]) -> dict[str, Tensor]:
        if self.rollout is None:
            raise RuntimeError("this rank holds no rollout engine (rollout.placement separate): the driver generates")
        if self.rollout.needs_weights:  # e.g. validation put a vLLM engine into a sleep that dropped its weights
            self.sync_weights(self.weight_version)
        self.rollout.wake()
        batch = self.rollout.generate(prompts, n, **sampling)
        self.rollout.sleep()
        return batch.stamped(self.weight_version).as_rows()

    # --- log-probs ---

    def _log_probs(self, model: nn.Module, rows: Rows, with_entropy: bool) -> dict[str, Tensor]:
        """Log-probs (and entropy) of the trimmed rows' response tokens, ``(b, r)``, from one packed forward.

        Logits are divided by the sampling temperature, as verl does, so that they describe the distribution the
        rollout sampled from.
        """
        from kuberl.trainer.lm_head import packed_response_log_probs

        return packed_response_log_probs(
            model,
            pack(trim(rows)),
            temperature=self.spec.rollout.temperature,
            with_entropy=with_entropy,
            device=self.device,
            compiled=self.compiles,
        )

    def compute_log_probs(self, rows: Rows) -> dict[str, Tensor]:
        """Old log-probs and entropy of the current policy, ``(B, R)`` each."""
        self.model.eval()
        return self.forward_only(rows, lambda mb: self._log_probs(self.model, mb, True), self.plan.log_prob)

    def compute_ref_log_probs(self, rows: Rows) -> dict[str, Tensor]:
        if self.ref is not None:
            fn = lambda mb: self._log_probs(self.ref, mb, False)  # noqa: E731
            out = self.forward_only(rows, fn, self.plan.log_prob)
        else:  # LoRA: the base model is the reference
            from peft import PeftModel

            assert isinstance(self.model, PeftModel), "without a reference model the policy carries LoRA adapters"
            self.model.eval()
            with self.model.disable_adapter():
                out = self.forward_only(rows, lambda mb: self._log_probs(self.model, mb, False), self.plan.log_prob)
        return {"ref_log_probs": out["log_probs"]}

    # --- update ---

    def update(self, mini_batches: list[Rows], totals: list[dict[str, float]]) -> dict[str, float]:
        actor = self.spec.actor
        return self.train(
            mini_batches,
            totals,
            loss_fn=self.policy_loss,
            micro=self.plan.actor_update,
            grad_clip=actor.optim.grad_clip,
            offload=actor.fsdp,
        )

    def policy_loss(self, mb: Rows, total: dict[str, float]) -> MicroLoss:
        """The PPO clipped policy loss, minus the entropy bonus, plus the KL loss when enabled.

        Without ``old_log_probs`` in the rows (:attr:`ExecutionPlan.old_log_probs_from_update`) they are this
        forward's, detached, and go back to the driver with the entropy as :attr:`MicroLoss.outputs`. With
        ``algorithm.rolloutCorrection`` each token's policy loss is weighted by its truncated π_old/π_rollout.
        """
        from kuberl.trainer.kl import kl_penalty
        from kuberl.trainer.losses import PolicyLossConfig, agg_loss, policy_loss, rollout_is_weights

        algo = self.spec.algorithm
        kl_loss = algo.kl.loss
        agg = {
            "batch_tokens": total["tokens"],
            "batch_seqs": total["seqs"],
            "loss_scale_factor": float(self.spec.data.max_response_length),
        }
        fused = "old_log_probs" not in mb  # the plan's old_log_probs_from_update: the driver sent none
        out = self._log_probs(self.model, mb, algo.entropy_coef > 0 or fused)
        mb = rows_to(mb, self.device)
        log_probs = out["log_probs"]
        old_log_probs = log_probs.detach() if fused else mb["old_log_probs"]
        mask = mb["response_mask"].float()
        correction = algo.rollout_correction
        weights = (
            rollout_is_weights(old_log_probs, mb["rollout_log_probs"], mask, correction.threshold)
            if correction.enabled
            else None
        )
        loss, metrics = policy_loss(
            log_probs,
            old_log_probs,
            mb["advantages"],
            mask,
            config=PolicyLossConfig.from_spec(algo),
            agg_mode=algo.loss_agg_mode,
            rollout_is_weights=weights,
            **agg,
        )
        per_batch = {"pg_loss": loss.detach()}
        if algo.entropy_coef > 0:
            entropy = agg_loss(out["entropy"], mask, algo.loss_agg_mode, **agg)
            loss = loss - algo.entropy_coef * entropy
        if kl_loss.enabled:
            kl = agg_loss(kl_penalty(log_probs, mb["ref_log_probs"], kl_loss.type), mask, algo.loss_agg_mode, **agg)
            loss = loss + kl_loss.coef * kl
            per_batch["kl_loss"] = kl.detach()
        per_token = {key: metrics[key].detach() for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl")}
        outputs = {"log_probs": old_log_probs, "entropy": out["entropy"].detach()} if fused else {}
        return MicroLoss(loss, per_batch, per_token, outputs)

    # --- checkpoints ---

    def save_checkpoint(self, folder: str) -> None:
        super().save_checkpoint(folder)
        if self.rank == 0:
            from kuberl.trainer.checkpoint import PARTIAL, publish_dir, write_json

            hf = Path(folder) / ("hf" + PARTIAL)
            self.config.save_pretrained(hf)
            self.tokenizer.save_pretrained(hf)
            publish_dir(hf, Path(folder) / "hf")
            write_json(Path(folder) / "lora.json", {} if self.lora_scaling is None else {"scaling": self.lora_scaling})

    def load_checkpoint(self, folder: str, step: int) -> None:
        super().load_checkpoint(folder, step)
        self.sync_weights(step)

    def full_weights(self) -> dict[str, Tensor]:
        """The policy's full weights under Hugging Face names (LoRA merged); a collective: call on every rank."""
        return {
            name: t.detach().cpu().clone()
            for name, t in fsdp.full_named_parameters(self.model, lora_scaling=self.lora_scaling)
        }

    def device_stats(self) -> dict[str, float]:
        return device_stats(self.device)

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"


class ValueModel(nn.Module):
    """A decoder plus a linear value head: ``values[b, t]`` is the value of the state ending at token ``t``."""

    def __init__(self, causal_lm: PreTrainedModel) -> None:
        super().__init__()
        self.backbone: PreTrainedModel = getattr(causal_lm, causal_lm.base_model_prefix)
        self.config = causal_lm.config
        self._no_split_modules = causal_lm._no_split_modules
        self.value_head = nn.Linear(self.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: Tensor, position_ids: Tensor, **attention: Any) -> Tensor:
        """``(1, T)`` packed tokens (:func:`~kuberl.trainer.microbatch.pack`) to ``(1, T)`` values; ``attention``:
        :meth:`~kuberl.trainer.microbatch.Packed.attention_kwargs`."""
        hidden = self.backbone(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **attention
        ).last_hidden_state
        values: Tensor = self.value_head(hidden.to(self.value_head.weight.dtype))
        return values.squeeze(-1)


class CriticWorker(DistributedWorker):
    role = "critic"

    def init_model(self, total_steps: int) -> dict[str, Any]:

        spec = self.spec
        critic = spec.critic
        assert critic is not None, "gae needs spec.critic (validation enforces it)"
        model = ValueModel(load_trainer_model(critic.model_path or spec.model.path))
        self.model = fsdp.prepare(
            model,
            device=self.device,
            dtype=spec.model.dtype,
            gradient_checkpointing=spec.model.gradient_checkpointing,
            compile_layers=self.compiles,
            reshard_after_forward=critic.fsdp.reshard_after_forward,
            param_offload=critic.fsdp.param_offload,
        )
        self.build_optimizer(critic.optim, total_steps)
        self.options = critic
        return {}

    def _values(self, rows: Rows) -> Tensor:
        """Values of the states before each response token of the trimmed rows, ``(b, r)``, 0 at padding."""
        packed = pack(trim(rows)).to(self.device)
        values: Tensor = self.model(packed.input_ids, packed.position_ids, **packed.attention_kwargs())
        return packed.unpack(values[0, packed.predictors].float())

    def compute_values(self, rows: Rows) -> dict[str, Tensor]:
        self.model.eval()
        return self.forward_only(rows, lambda mb: {"values": self._values(mb)}, self.plan.critic_forward)

    def update(self, mini_batches: list[Rows], totals: list[dict[str, float]]) -> dict[str, float]:
        return self.train(
            mini_batches,
            totals,
            loss_fn=self.value_loss,
            micro=self.plan.critic_update,
            grad_clip=self.options.optim.grad_clip,
            offload=self.options.fsdp,
        )

    def value_loss(self, mb: Rows, total: dict[str, float]) -> MicroLoss:
        """The clipped value loss (verl's ``compute_value_loss``)."""
        from kuberl.trainer.losses import value_loss

        values = self._values(mb)
        mb = rows_to(mb, self.device)
        mask = mb["response_mask"].float()
        loss, metrics = value_loss(
            values,
            mb["values"],
            mb["returns"],
            mask,
            cliprange_value=self.options.cliprange_value,
            agg_mode=self.spec.algorithm.loss_agg_mode,
            batch_tokens=total["tokens"],
            batch_seqs=total["seqs"],
            loss_scale_factor=float(self.spec.data.max_response_length),
        )
        return MicroLoss(loss, {"vf_loss": loss.detach()}, {"vf_clipfrac": metrics["vf_clipfrac"].detach()})


class RewardModelWorker:
    """Scores ``prompt + response`` texts with ``reward.model`` (one per rank; the driver splits the texts)."""

    def __init__(self, spec_json: str, rank: int, world_size: int, threads: int, plan: ExecutionPlan) -> None:
        from kuberl.trainer.rewards import RewardModelScorer

        spec = RLJobSpec.model_validate_json(spec_json)
        torch.set_num_threads(max(1, threads))
        rm = spec.reward.model
        assert rm is not None
        device = "cuda" if spec.cluster.device == "cuda" else "cpu"
        self.scorer = RewardModelScorer(
            rm.path,
            micro_batch_size=rm.micro_batch_size_per_gpu,
            dtype=fsdp.compute_dtype(spec.model.dtype, device),
            max_length=rm.max_length,
            device=device,
        )
        self.rank = rank

    def init_distributed(self, address: str, port: int) -> None:
        """Scoring is embarrassingly parallel: no process group."""

    def rendezvous(self) -> tuple[str, int]:
        return "", 0

    def score(self, texts: list[str]) -> list[float]:
        return self.scorer.score(texts)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def device_stats(device: torch.device) -> dict[str, float]:
    """torch's peak allocated memory (GPU) and, when ``pynvml`` is importable, NVML utilisation (mean over the step)
    and memory in use (largest over the step, and now)."""
    stats: dict[str, float] = {}
    if device.type != "cuda":
        return stats
    stats["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    stats["max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 2**30
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


class WorkerGroup:
    """``world_size`` Ray actors of ``cls``, rank ``r`` in bundle ``r`` of ``placement_group``."""

    def __init__(
        self,
        cls: type,
        *,
        role: str,
        spec: RLJobSpec,
        placement_group: Any,
        world_size: int,
        threads: int,
        plan: ExecutionPlan | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``plan``: the driver's execution plan; without one, the plan of ``spec`` alone (a colocated rollout), for
        a group driven on its own."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        plan = plan or plan_execution(spec)
        share = FRACTION[role]
        remote: Any = ray.remote(cls)
        gpu = spec.cluster.device == "cuda"
        spec_json = spec.model_dump_json()
        self.role = role
        self.workers: list[Any] = [  # Ray actor handles
            remote.options(
                num_cpus=share,
                num_gpus=share if gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=r),
                runtime_env={"env_vars": env or {}},
            ).remote(spec_json, r, world_size, threads, plan)
            for r in range(world_size)
        ]
        address, port = ray.get(self.workers[0].rendezvous.remote())
        ray.get([w.init_distributed.remote(address, port) for w in self.workers])

    def __len__(self) -> int:
        return len(self.workers)

    def all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` with the same arguments on every rank and wait for all."""
        import ray

        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def each(self, method: str, per_rank: list[tuple[Any, ...]], timeout: float | None = None) -> list[Any]:
        """Call ``method`` on rank ``r`` with ``per_rank[r]`` as arguments; Ray's GetTimeoutError after ``timeout``
        seconds."""
        import ray

        calls = [getattr(w, method).remote(*args) for w, args in zip(self.workers, per_rank, strict=True)]
        return ray.get(calls, timeout=timeout)

    def kill(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
