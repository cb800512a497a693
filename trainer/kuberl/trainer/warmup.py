"""Supervised warm-up of a policy on demonstrations of the calculator task (``kuberl data arithmetic``).

Why: a randomly initialised tiny model never writes a tool call, so RL on the agent task gets no signal. Training
on demonstrations, some that call the calculator and the rest that answer the product directly, gives a starting
policy that calls the tool in part of its samples (about ``call_share``) and cannot multiply without it; RL must then
raise the call rate and the reward (tests/trainer/test_agent_learning_cpu.py). The policy must also copy: the
expression into its call, the tool's output into its answer. On the ``short`` layout the example's tiny llama learns
both (the copies sit at fixed, short distances); on the ``chat`` layout it learns the call syntax but never the
operands (docs/agentic.md has the measurements).

Demonstrations are token ids laid out exactly as :class:`~kuberl.trainer.rollout.agent.AgentLoop` builds a
trajectory (the row's ``extra_info["call"]``, the tool turn from the loop's own
:class:`~kuberl.trainer.rollout.agent.ObservationRenderer`, the observation from the builtin calculator), with the
loss on the policy's tokens only. ``python -m kuberl.trainer.warmup OUT`` writes the warmed policy of
examples/agent-calculator-cpu.yaml.
"""

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kuberl.trainer.data.tasks import ARITHMETIC_LAYOUTS, arithmetic
from kuberl.trainer.model.loading import load_causal_lm, load_tokenizer, save_hf
from kuberl.trainer.rollout.agent import ObservationRenderer
from kuberl.trainer.rollout.tools import calculator

WARM_MODEL = "tiny://llama?hidden=64&layers=2&heads=4&kv_heads=2&seed=0"
"""The tiny model of examples/agent-calculator-cpu.yaml."""


@dataclass(frozen=True)
class Demonstration:
    ids: list[int]
    """Prompt (chat template, generation prompt included) and response."""
    loss_mask: list[int]
    """1 on the tokens the policy writes: the call and its turn end, the answer and its eos."""


def arithmetic_demonstration(
    row: dict[str, Any], tokenizer: PreTrainedTokenizerBase, renderer: ObservationRenderer, *, call: bool
) -> Demonstration:
    """One ``kuberl data arithmetic`` row solved with the calculator (``call``: call, tool turn, the product) or
    answered directly (the product at once). The policy closes its call turn with eos, as a tool-calling chat model
    does, so generation stops there; the loop keeps the call and renders the same turn end itself."""
    text = str(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False))
    prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    eos = [int(tokenizer.eos_token_id)]
    expression = row["extra_info"]["expression"]
    product = calculator(expression)
    if product != row["reward_model"]["ground_truth"]:
        raise ValueError(
            f"row {row['extra_info']}: the calculator gives {product} for {expression!r}, the ground truth is "
            f"{row['reward_model']['ground_truth']!r}; not a kuberl data arithmetic row"
        )
    if call and "call" not in row["extra_info"]:
        raise ValueError(
            f"row {row['extra_info']}: no extra_info.call to demonstrate; rows written by kuberl data arithmetic "
            "carry the call that solves them"
        )
    answer = [*tokenizer.encode(product, add_special_tokens=False), *eos]
    response: list[tuple[list[int], int]] = []
    if call:
        response.append(([*tokenizer.encode(row["extra_info"]["call"], add_special_tokens=False), *eos], 1))
        response.append((renderer.ids(product, after_eos=True), 0))
    response.append((answer, 1))
    ids, mask = list(prompt), [0] * len(prompt)
    for part, policy in response:
        ids.extend(part)
        mask.extend([policy] * len(part))
    return Demonstration(ids, mask)


def batch_tensors(demonstrations: list[Demonstration], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and next-token ``labels`` (-100 where no loss)."""
    width = max(len(d.ids) for d in demonstrations)
    ids = torch.full((len(demonstrations), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, d in enumerate(demonstrations):
        k = len(d.ids)
        ids[i, :k] = torch.as_tensor(d.ids)
        attention[i, :k] = 1
        labels[i, :k] = torch.where(torch.as_tensor(d.loss_mask).bool(), ids[i, :k], -100)
    return ids, attention, labels


def warm_up(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    call_share: float,
    steps: int,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` in place on arithmetic demonstrations, ``call_share`` of them with the calculator call;
    returns the loss per step. AdamW, constant ``lr``, demonstrations drawn with ``seed``."""
    if not 0.0 <= call_share <= 1.0 or steps < 1 or batch_size < 1 or not rows:
        raise ValueError(
            f"need 0 ≤ call_share ≤ 1, steps ≥ 1, batch_size ≥ 1 and rows; got call_share={call_share}, "
            f"steps={steps}, batch_size={batch_size}, {len(rows)} rows"
        )
    rng = random.Random(f"warm_up:{seed}")
    renderer = ObservationRenderer(tokenizer, "chat_template")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    built: dict[tuple[int, bool], Demonstration] = {}

    def demonstration(index: int, call: bool) -> Demonstration:
        if (index, call) not in built:
            built[index, call] = arithmetic_demonstration(rows[index], tokenizer, renderer, call=call)
        return built[index, call]

    losses = []
    for _ in range(steps):
        demonstrations = [demonstration(rng.randrange(len(rows)), rng.random() < call_share) for _ in range(batch_size)]
        ids, attention, labels = batch_tensors(demonstrations, int(tokenizer.pad_token_id))
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """A Hugging Face folder that ``model.path`` loads by path."""
    return save_hf(model.state_dict(), model.config, tokenizer, str(out_dir))


def main(argv: list[str] | None = None) -> int:
    """``python -m kuberl.trainer.warmup``: warm a tiny policy up on ``kuberl data arithmetic`` rows and save it."""
    parser = argparse.ArgumentParser(prog="python -m kuberl.trainer.warmup", description=main.__doc__)
    parser.add_argument("out", help="the Hugging Face folder to write (model.path loads it)")
    parser.add_argument("--model", default=WARM_MODEL, help=f"the policy to start from (default {WARM_MODEL})")
    parser.add_argument("--layout", choices=ARITHMETIC_LAYOUTS, default="short", help="kuberl data arithmetic layout")
    parser.add_argument("--rows", type=int, default=4000, help="arithmetic rows (split 'warmup', seed --seed)")
    parser.add_argument("--call-share", type=float, default=0.3, help="share of demonstrations that call the tool")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.model)
    torch.manual_seed(args.seed)
    model = load_causal_lm(args.model, torch.float32)
    rows = arithmetic(args.rows, seed=args.seed, split="warmup", layout=args.layout)
    started = time.monotonic()
    losses = warm_up(
        model,
        tokenizer,
        rows,
        call_share=args.call_share,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    out = save_policy(model, tokenizer, args.out)
    print(
        f"warmed {args.model} on {args.rows} {args.layout} rows: {args.steps} steps × {args.batch_size}, call share "
        f"{args.call_share}, lr {args.lr}, seed {args.seed}; loss {losses[0]:.3f} → {losses[-1]:.3f} in "
        f"{time.monotonic() - started:.0f} s; wrote {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
