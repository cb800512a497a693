"""The policy's rank: the FSDP2 policy, the frozen reference (a second FSDP2 model, or with LoRA the same model under
``disable_adapter()``) and either the colocated rollout engine or, with ``placement: separate``, the sending end of
the weight transfer to the engines (:class:`kuberl.trainer.rollout.weight_sync.WeightBroadcaster`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from kuberl.trainer.model import fsdp
from kuberl.trainer.model.microbatch import (
    Rows,
    pack,
    rows_to,
    trim,
)
from kuberl.trainer.workers.base import DistributedWorker, MicroLoss, _as_list, device_stats, load_trainer_model
from kuberl.trainer.workers.dispatch import Dispatch, dispatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kuberl.api.engines import Transport
    from kuberl.trainer.rollout.base import ColocatedRollout
    from kuberl.trainer.rollout.registry import Engine
    from kuberl.trainer.rollout.weight_sync import ObjectStoreSender, WeightBroadcaster


class ActorWorker(DistributedWorker):
    role = "actor"

    def init_model(self, total_steps: int, rollout_engine: Engine) -> dict[str, Any]:
        """``rollout_engine``: the registry's entry of rollout.engine, as the driver looked it up."""
        from kuberl.trainer.model.loading import load_tokenizer, num_params

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
        self.rollout = self.build_rollout(eos_ids, rollout_engine)
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

    def build_rollout(self, eos_ids: list[int], rollout_engine: Engine) -> ColocatedRollout | None:
        """The colocated engine of this rank (``hf``: a plain copy of the policy; ``vllm``: an engine on this rank's
        GPU with dummy weights that the first :meth:`sync_weights` replaces). None when the rollout is separate: the
        driver starts the engines and then calls :meth:`connect_rollout`."""
        from kuberl.trainer.rollout.registry import EngineContext

        if self.plan.rollout.separate:
            return None
        context = EngineContext(self.tokenizer.pad_token_id, eos_ids, self.device, self.plan.threads)
        return rollout_engine.make_colocated(self.plan.engine, context)

    def broadcast_group(self, engine_world_sizes: list[int]) -> Any:
        """Where the NCCL group of a separate rollout meets: on this rank's node (call it on rank 0)."""
        from kuberl.trainer.rollout.weight_sync import new_broadcast_group

        return new_broadcast_group(engine_world_sizes)

    def connect_rollout(self, engines: list[Any], transport: Transport, group: Any) -> None:
        """Join the weight transfer to the separate engines (on every rank; rank 0 blocks until they joined)."""
        from kuberl.trainer.rollout.weight_sync import ObjectStoreSender, WeightBroadcaster

        if transport == "object_store":
            self.broadcaster = ObjectStoreSender(engines, rank=self.rank)
        else:
            self.broadcaster = WeightBroadcaster(engines, rank=self.rank, transport=transport, group=group)

    def sync_weights(self, version: int) -> list[int]:
        """Send the gathered full weights, the result of trainer step ``version``, to the rollout engine(s); the
        indices of separate engines found dead meanwhile (:class:`~kuberl.trainer.rollout.weight_sync.ObjectStoreSender`).

        Colocated, every rank streams into its own engine, whose KV cache stays asleep meanwhile (update_weights
        wakes only the weights), which keeps the peak memory down; separate, the ranks feed the broadcaster (the
        engines keep the version and stamp their batches with it).
        """
        lost: list[int] = []
        if self.broadcaster is not None:
            lost = self.broadcaster.send_fsdp(
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
        return lost

    @dispatch(Dispatch.PROMPTS)
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
        from kuberl.trainer.model.lm_head import packed_response_log_probs

        return packed_response_log_probs(
            model,
            pack(trim(rows)),
            temperature=self.spec.rollout.temperature,
            with_entropy=with_entropy,
            device=self.device,
            compiled=self.compiles,
        )

    @dispatch(Dispatch.ROWS)
    def compute_log_probs(self, rows: Rows) -> dict[str, Tensor]:
        """Old log-probs and entropy of the current policy, ``(B, R)`` each."""
        self.model.eval()
        return self.forward_only(rows, lambda mb: self._log_probs(self.model, mb, True), self.plan.log_prob)

    @dispatch(Dispatch.ROWS)
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

    @dispatch(Dispatch.MINI_BATCH)
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
        from kuberl.trainer.algorithms.kl import kl_penalty
        from kuberl.trainer.algorithms.losses import agg_loss, policy_loss, rollout_is_weights

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
            config=self.plan.policy_loss,
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
            from kuberl.trainer.checkpoint.files import PARTIAL, publish_dir, write_json

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
        stats = device_stats(self.device)
        if stats and self.rollout is not None:  # its pool sits inside the allocator peaks above: reported apart
            stats["engine_pool_gb"] = self.rollout.pool_bytes / 2**30
        return stats

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
