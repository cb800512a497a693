"""Weight loads into a colocated vLLM engine that skip vLLM's loader after the first one.

vLLM's ``load_weights`` maps each Hugging Face tensor onto its own parameters (q, k and v into one ``qkv_proj``, the
vocabulary padded to a multiple of 64, ...) in Python, one call per tensor: at the Qwen2-0.5B shape on an H100 that
per-tensor work was most of a 24–38 ms load (docs/performance.md (c)). For an unquantized model on one GPU each of
those calls ends in ``copy_`` of the whole tensor into a view of a parameter, or ``fill_`` of padding.

The first load runs vLLM's loader with those calls recorded (:class:`LoadRecorder`). The records become a
:class:`LoadPlan` only if they explain the whole load: every copy is from a whole sent tensor, the loaded values are
exactly what the copies and fills put there, and every element of every parameter is written exactly once. Later
loads replay the plan, one cast-and-copy kernel per tensor straight from the trainer's weights, with no bucket
buffer. A model whose loader does anything else (slices for tensor parallelism, transforms, quantization) keeps
vLLM's loader, and the reason is kept (:attr:`LoadRecorder.refused`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

Named = Iterable[tuple[str, Tensor]]


@dataclass(frozen=True)
class Fill:
    """A parameter region vLLM's loader sets to a constant (the vocabulary's padding rows)."""

    target: Tensor
    value: float


@dataclass(frozen=True)
class LoadPlan:
    """Where each sent tensor lands in the engine's parameters, and what is filled: vLLM's first load, replayed."""

    copies: dict[str, tuple[Tensor, ...]]
    """Hugging Face name → the parameter views it is copied into (none: vLLM's loader ignores it)."""
    fills: tuple[Fill, ...]
    dtype: torch.dtype
    """The dtype the first load sent (the rollout dtype): a parameter kept in another dtype gets the tensor rounded
    to this one first, as vLLM's loader got it."""

    @torch.no_grad()
    def load(self, named: Named) -> None:
        """Copy each of ``named`` into its views (casting to the parameters' dtype in the copy), then the fills.
        The same names as the first load, each once: anything else means the plan no longer describes the load."""
        seen: set[str] = set()
        for name, tensor in named:
            targets = self.copies.get(name)
            if targets is None or name in seen:
                raise RuntimeError(
                    f"weight load: {name!r} was {'sent twice' if name in seen else 'not among the first load'}; the "
                    "load plan only replays the tensors of the engine's first load"
                )
            seen.add(name)
            for target in targets:
                if target.shape != tensor.shape:  # copy_ would broadcast a smaller tensor without a word
                    raise RuntimeError(f"weight load: {name!r} is {tuple(tensor.shape)}, {tuple(target.shape)} before")
                target.copy_(tensor if target.dtype == self.dtype else tensor.to(self.dtype))
        missing = sorted(self.copies.keys() - seen)
        if missing:
            raise RuntimeError(f"weight load: {len(missing)} tensors of the first load were not sent: {missing[:5]}")
        for fill in self.fills:
            fill.target.fill_(fill.value)


class LoadRecorder(TorchFunctionMode):
    """Records the ``copy_`` and ``fill_`` calls of vLLM's loader over the buckets of one load, checks each bucket's
    copies against what landed, and turns the records into a :class:`LoadPlan` (:meth:`plan`)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: dict[str, list[Tensor]] = {}
        self.fills: list[Fill] = []
        self.refused: str | None = None
        """Why the records cannot stand for the load (the first reason found); None while they can."""
        self.dtypes: set[torch.dtype] = set()
        """The dtypes of the sent tensors."""
        self._sources: dict[tuple[int, tuple[int, ...], tuple[int, ...]], str] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is Tensor.copy_:
            target, source = args[0], args[1]
            name = self._sources.get(_identity(source))
            if name is None:
                self._refuse(f"the loader copied {tuple(source.shape)} from something other than a whole sent tensor")
            else:
                self.copies[name].append(target)
        elif func is Tensor.fill_ or func is Tensor.zero_:
            value = 0 if func is Tensor.zero_ else args[1]
            if isinstance(value, (int, float)) and value == 0:
                self.fills.append(Fill(args[0], 0.0))
            else:  # a value that may come from a sent tensor (a one-element one's item()): replaying it would freeze it
                self._refuse(f"the loader filled a region with {value!r}, not zero")
        return func(*args, **kwargs)

    @torch.no_grad()
    def load(self, model: nn.Module, bucket: list[tuple[str, Tensor]]) -> None:
        """``model.load_weights(bucket)`` with its copies and fills recorded, then each copy checked against the
        value that landed."""
        self._sources = {_identity(tensor): name for name, tensor in bucket if tensor.numel()}
        for name, tensor in bucket:
            if name in self.copies:
                self._refuse(f"{name!r} was sent twice")
            if tensor.numel() == 1:  # vLLM's default loader fills a one-element parameter with the value, no copy
                self._refuse(f"{name!r} has one element")
            self.copies.setdefault(name, [])
            self.dtypes.add(tensor.dtype)
        with self:
            model.load_weights(bucket)  # type: ignore[operator]
        sent = dict(bucket)
        for name in sent:
            for target in self.copies[name]:
                if not torch.equal(target, sent[name].to(target.dtype)):
                    self._refuse(f"{name!r} landed changed (the loader transforms it after the copy)")
        self._sources = {}

    @torch.no_grad()
    def plan(self, model: nn.Module) -> LoadPlan | None:
        """The plan, if the records wrote every element of every parameter of ``model`` exactly once and every fill
        still holds its value; else None, with :attr:`refused` saying why."""
        written = _write_counts(model, [t for ts in self.copies.values() for t in ts] + [f.target for f in self.fills])
        if isinstance(written, str):
            self._refuse(written)
        else:
            for name, counts in written.items():
                if not bool((counts == 1).all()):
                    never, twice = int((counts == 0).sum()), int((counts > 1).sum())
                    self._refuse(f"parameter {name}: {never} elements no copy or fill wrote, {twice} written twice")
                    break
        for fill in self.fills:
            if not bool((fill.target == fill.value).all()):
                self._refuse("a filled region was overwritten after its fill")
        if len(self.dtypes) != 1:
            self._refuse(f"the tensors were sent in {len(self.dtypes)} dtypes, not one")
        if self.refused is not None:
            return None
        return LoadPlan(
            copies={name: tuple(targets) for name, targets in self.copies.items()},
            fills=tuple(fill for fill in self.fills if fill.target.numel()),
            dtype=next(iter(self.dtypes)),
        )

    def _refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why


def _identity(tensor: Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """A tensor's memory, shape and strides: a view of a whole sent tensor (``narrow`` over all of it) has its."""
    return tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride())


def _write_counts(model: nn.Module, targets: list[Tensor]) -> dict[str, Tensor] | str:
    """How many times ``targets`` write each element of each of ``model``'s parameters, or why that cannot be told
    (a target outside every parameter, a parameter that is not contiguous)."""
    params = [(name, p) for name, p in model.named_parameters() if p.numel()]
    counts = {name: torch.zeros(p.numel(), dtype=torch.int32, device=p.device) for name, p in params}
    for target in targets:
        if not target.numel():
            continue
        start = target.data_ptr()
        owner = next(
            (
                (name, p)
                for name, p in params
                if p.data_ptr() <= start < p.data_ptr() + p.numel() * p.element_size() and p.dtype == target.dtype
            ),
            None,
        )
        if owner is None:
            return f"the loader wrote {tuple(target.shape)} outside every parameter"
        name, param = owner
        if not param.is_contiguous():
            return f"parameter {name} is not contiguous"
        offset = (start - param.data_ptr()) // param.element_size()
        try:
            counts[name].as_strided(target.shape, target.stride(), offset).add_(1)
        except RuntimeError:
            return f"the loader wrote past the end of parameter {name}"
    return counts
