"""Log-probs and entropy from the output head chunk by chunk: the same values and gradients as from the full logits,
and no tensor of tokens × vocabulary is ever created, forward or backward."""

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from kuberl.trainer.algorithms.losses import entropy_from_logits, log_probs_from_logits
from kuberl.trainer.model.lm_head import token_log_probs

N, H, V = 256, 16, 1000


class LargestTensor(TorchDispatchMode):
    """Records the bytes of the largest tensor any operator returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def setup() -> tuple[Tensor, nn.Linear, Tensor]:
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    return hidden, head, torch.randint(0, V, (N,), generator=g)


@pytest.mark.parametrize("chunk", [1, 7, 64, N])
def test_chunked_values_and_gradients_equal_the_full_logits(chunk):
    hidden, head, targets = setup()
    logits = head(hidden) / 0.7
    full_lp, full_ent = log_probs_from_logits(logits, targets), entropy_from_logits(logits)
    (full_lp.sum() + 0.3 * full_ent.sum()).backward()
    full_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    out = token_log_probs(hidden, head, targets, temperature=0.7, with_entropy=True, chunk_tokens=chunk)
    torch.testing.assert_close(out["log_probs"], full_lp, atol=1e-5, rtol=1e-6)
    # entropy is logsumexp - sum(p * z): a difference of two float32 numbers near max|z| ~ 20 here, so the order of
    # the sums alone moves it by a few units of 20 * 2**-23 (1.3e-5 seen on CI's CPU)
    torch.testing.assert_close(out["entropy"], full_ent, atol=5e-5, rtol=1e-6)
    (out["log_probs"].sum() + 0.3 * out["entropy"].sum()).backward()
    torch.testing.assert_close(hidden.grad, full_grads[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(head.weight.grad, full_grads[1], atol=1e-5, rtol=1e-5)


def test_without_entropy_only_log_probs_come_back():
    hidden, head, targets = setup()
    out = token_log_probs(hidden, head, targets, temperature=2.0, with_entropy=False, chunk_tokens=10)
    torch.testing.assert_close(out["log_probs"], log_probs_from_logits(head(hidden) / 2.0, targets), atol=1e-5, rtol=0)
    assert "entropy" not in out


@pytest.mark.parametrize("grad", [False, True])
def test_the_largest_tensor_is_one_chunk_of_logits_not_all_of_them(grad):
    hidden, head, targets = setup()
    chunk = 16
    with torch.set_grad_enabled(grad), LargestTensor() as unchunked:
        out = token_log_probs(hidden, head, targets, temperature=1.0, with_entropy=True, chunk_tokens=N)
        if grad:
            (out["log_probs"].sum() + out["entropy"].sum()).backward()
    with torch.set_grad_enabled(grad), LargestTensor() as chunked:
        out = token_log_probs(hidden, head, targets, temperature=1.0, with_entropy=True, chunk_tokens=chunk)
        if grad:
            (out["log_probs"].sum() + out["entropy"].sum()).backward()
    assert unchunked.largest == N * V * 4
    # one chunk of float32 logits, or the head's weight (and its gradient), whichever is larger
    assert chunked.largest == max(chunk, H) * V * 4


@pytest.mark.parametrize(
    "head_kind, temperature, entropy_weight",
    [("linear-with-bias", 0.0, 0.0), ("linear-with-bias", 1.3, -0.5), ("other-module", 0.7, 0.3)],
)
def test_biased_greedy_and_wrapped_heads_equal_the_full_logits(head_kind, temperature, entropy_weight):
    """The fused backward with a bias, with the entropy returned but not differentiated, and at temperature 0
    (unscaled logits); a head that is not a plain ``nn.Linear`` (a LoRA-wrapped one) takes the checkpointed path."""
    hidden, linear, targets = setup()
    g = torch.Generator().manual_seed(1)
    biased = nn.Linear(H, V)
    with torch.no_grad():
        biased.weight.copy_(linear.weight)
        biased.bias.copy_(torch.randn(V, generator=g))
    head = biased if head_kind == "linear-with-bias" else nn.Sequential(biased)
    logits = (biased(hidden) / (temperature or 1.0)).double()  # float32's lse − Σ p·z cancels at these magnitudes
    full_lp, full_ent = log_probs_from_logits(logits, targets).float(), entropy_from_logits(logits).float()
    (full_lp.sum() + entropy_weight * full_ent.sum()).backward()
    expected = [hidden.grad.clone(), biased.weight.grad.clone(), biased.bias.grad.clone()]
    hidden.grad = biased.weight.grad = biased.bias.grad = None

    out = token_log_probs(hidden, head, targets, temperature=temperature, with_entropy=True, chunk_tokens=50)
    torch.testing.assert_close(out["log_probs"], full_lp, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(out["entropy"], full_ent, atol=1e-5, rtol=1e-6)
    loss = out["log_probs"].sum() + (entropy_weight * out["entropy"].sum() if entropy_weight else 0.0)
    loss.backward()
    for got, want in zip([hidden.grad, biased.weight.grad, biased.bias.grad], expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature, entropy_weight", [(0.7, 0.3), (0.0, 0.0)])
def test_compiled_chunk_math_equals_the_eager_one_over_changing_lengths(temperature, entropy_weight):
    """``model.compile``'s head: the chunk math through ``torch.compile`` (inductor's CPU code here) gives the eager
    values and gradients, for a biased head, ragged last chunks and two token counts (one dynamic graph)."""
    _, linear, _ = setup()
    head = nn.Linear(H, V)
    with torch.no_grad():
        head.weight.copy_(linear.weight)
        head.bias.normal_(generator=torch.Generator().manual_seed(2))

    def run(n: int, compiled: bool) -> list[Tensor]:
        g = torch.Generator().manual_seed(n)
        hidden = torch.randn(n, H, generator=g, requires_grad=True)
        targets = torch.randint(0, V, (n,), generator=g)
        head.zero_grad(set_to_none=True)
        out = token_log_probs(
            hidden, head, targets, temperature=temperature, with_entropy=True, compiled=compiled, chunk_tokens=64
        )
        (out["log_probs"].sum() + entropy_weight * out["entropy"].sum()).backward()
        return [out["log_probs"], out["entropy"], hidden.grad, head.weight.grad, head.bias.grad]

    for n in (N, 150):
        for got, want in zip(run(n, compiled=True), run(n, compiled=False), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
