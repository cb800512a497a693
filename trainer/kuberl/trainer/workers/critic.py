"""The value model's rank: the policy's decoder (``AutoModelForCausalLM.<base_model_prefix>``) plus a fresh
``nn.Linear(hidden, 1)`` value head (zero-initialised, so the first values are 0). It is a small module of ours rather
than ``AutoModelForTokenClassification`` because the tiny test models and GGUF-converted folders load as causal LMs,
and the decoder weights then come from the same loader as the actor's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from kuberl.trainer.model import fsdp
from kuberl.trainer.model.microbatch import (
    Rows,
    pack,
    rows_to,
    trim,
)
from kuberl.trainer.workers.base import DistributedWorker, MicroLoss, load_trainer_model
from kuberl.trainer.workers.dispatch import Dispatch, dispatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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
        """``(1, T)`` packed tokens (:func:`~kuberl.trainer.model.microbatch.pack`) to ``(1, T)`` values; ``attention``:
        :meth:`~kuberl.trainer.model.microbatch.Packed.attention_kwargs`."""
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

    @dispatch(Dispatch.ROWS)
    def compute_values(self, rows: Rows) -> dict[str, Tensor]:
        self.model.eval()
        return self.forward_only(rows, lambda mb: {"values": self._values(mb)}, self.plan.critic_forward)

    @dispatch(Dispatch.MINI_BATCH)
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
        from kuberl.trainer.algorithms.losses import value_loss

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
