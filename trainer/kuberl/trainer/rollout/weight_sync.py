"""Moving the actor's weights into the rollout engines after every update.

Two paths, one per ``rollout.placement``:

- ``colocated``: every trainer rank owns a vLLM engine on its own GPU. Each rank gathers the FSDP2 shards
  parameter by parameter (``full_tensor()``, a collective: every rank iterates in the same order; on one rank the
  local shard), groups the full tensors into buckets of ``bucket_mb``, packs each bucket into one buffer in the
  rollout dtype (:class:`FlatBucket`) and hands views of it to its engine (``load_weights``) before the next one is
  gathered, so at most one bucket of full tensors exists beside the shards. That first load is recorded; when the
  records explain it, later loads copy each tensor straight into the engine's parameters
  (:mod:`kuberl.trainer.rollout.direct_load`).
- ``separate``: the engines live in their own Ray actors. On GPUs of their own, trainer rank 0 and every engine
  worker join one NCCL group (vLLM's ``nccl`` weight-transfer backend on both ends); rank 0 broadcasts packed
  buffers of ``bucket_mb`` and the engines unpack them into ``load_weights``. Sharing the trainer's GPUs, the
  buffers travel by CUDA IPC instead (vLLM's ``ipc`` backend). CPU engines (``hf``) get one state dict through the
  Ray object store (:class:`ObjectStoreSender`). Either way all trainer ranks iterate the shards (the gathers are
  collectives).

Every send carries the weights' version, the trainer step they are the result of (0: the initial weights); the
engines keep it and stamp every batch they generate with it (``weight_version``), so a batch's staleness is
checkable against the step that trains it.

Names are Hugging Face's (``model.layers.0.self_attn.q_proj.weight``); vLLM's ``load_weights`` maps them onto its
fused layers. With tied embeddings the output head is the embedding matrix, so ``lm_head.weight`` is never sent.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from kuberl.api.engines import Transport
from kuberl.trainer.model.fsdp import LORA_PREFIX, full_named_parameters

DEFAULT_BUCKET_MB = 512
VLLMTransport = Literal["nccl", "ipc"]
"""vLLM's weight-transfer backends: NCCL broadcast (GPUs of its own) or CUDA IPC (the trainer's GPUs)."""
VLLM_TRANSPORTS: tuple[str, ...] = get_args(VLLMTransport)
"""How a separate rollout receives weights: a vLLM backend, or the Ray object store (CPU engines)."""
TIED_HEAD = "lm_head.weight"

Bucket = list[tuple[str, Tensor]]


def is_tied(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False))


def rollout_named_tensors(
    named: Iterable[tuple[str, Tensor]],
    *,
    tied: bool,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Iterator[tuple[str, Tensor]]:
    """``named`` with the tied output head dropped, each tensor cast to ``dtype`` and moved to ``device``."""
    for name, tensor in named:
        if tied and name == TIED_HEAD:
            continue
        if dtype is not None or device is not None:
            tensor = tensor.to(device=device, dtype=dtype, non_blocking=True)
        yield name, tensor


def bucketed(named: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[Bucket]:
    """Consecutive groups of at most ``bucket_bytes`` (a tensor larger than that is a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    bucket: Bucket = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


@dataclass(frozen=True)
class FlatBucket:
    """A bucket as one contiguous 1-D buffer plus where each tensor lies in it.

    Built with one concatenation and one cast per bucket instead of a cast and a copy per tensor (the per-tensor
    Python and kernel-launch cost dominated the weight sync of small models); :meth:`tensors` gives the receiving
    ``load_weights`` views into the buffer, no copies.
    """

    buffer: Tensor
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    """Element offset of each tensor in ``buffer``."""

    def tensors(self) -> Bucket:
        out: Bucket = []
        for name, shape, offset in zip(self.names, self.shapes, self.offsets, strict=True):
            numel = math.prod(shape)
            out.append((name, self.buffer[offset : offset + numel].view(shape)))
        return out


def flatten(
    bucket: Bucket, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> FlatBucket:
    """``bucket`` packed into one buffer of ``dtype`` on ``device`` (each default: the first tensor's)."""
    if not bucket:
        raise ValueError("cannot flatten an empty bucket")
    first = bucket[0][1]
    dtype = dtype or first.dtype
    offsets = []
    total = 0
    for _, tensor in bucket:
        offsets.append(total)
        total += tensor.numel()
    parts = [tensor.detach().reshape(-1) for _, tensor in bucket]
    if len({part.dtype for part in parts}) > 1:  # torch.cat would promote: cast each to the wire dtype first
        parts = [part.to(dtype) for part in parts]
    return FlatBucket(
        buffer=torch.cat(parts).to(device=device or first.device, dtype=dtype),
        names=tuple(name for name, _ in bucket),
        shapes=tuple(tuple(tensor.shape) for _, tensor in bucket),
        offsets=tuple(offsets),
    )


def fsdp_weight_buckets(
    model: nn.Module,
    *,
    bucket_mb: int = DEFAULT_BUCKET_MB,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
    lora_scaling: float | None = None,
) -> Iterator[Bucket]:
    """Full (unsharded) weights of an FSDP2 model in buckets of ``bucket_mb`` MiB, in the rollout dtype.

    Every rank of the FSDP group must drain this iterator in lockstep: each parameter's ``full_tensor()`` is an
    all-gather. LoRA adapters are merged into their base weights (``fsdp.full_named_parameters``).
    """
    named = full_named_parameters(model, lora_scaling=lora_scaling)
    yield from bucketed(
        rollout_named_tensors(named, tied=is_tied(_base(model)), dtype=dtype, device=device), bucket_mb * 1024 * 1024
    )


def _base(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


@dataclass(frozen=True)
class ParamMeta:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def fsdp_param_metadata(
    model: nn.Module, *, dtype: torch.dtype = torch.bfloat16, lora: bool = False
) -> list[ParamMeta]:
    """Name, wire dtype and full shape of every tensor :func:`fsdp_weight_buckets` yields, in the same order,
    read from the DTensors' global shapes without gathering anything."""
    tied = is_tied(_base(model))
    metas = []
    for name, param in model.named_parameters():
        if lora:
            if ".lora_" in name:
                continue
            name = name.removeprefix(LORA_PREFIX).replace(".base_layer.", ".")
        if tied and name == TIED_HEAD:
            continue
        metas.append(ParamMeta(name, dtype, tuple(param.shape)))
    return metas


# --- separate placement: NCCL broadcast or CUDA IPC --------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:
        pass
    return socket.gethostbyname(socket.gethostname())


@dataclass(frozen=True)
class BroadcastGroup:
    """Where the trainer-to-engines NCCL group meets: rank 0 is the trainer, engine ``i``'s workers follow."""

    master_address: str
    master_port: int
    engine_world_sizes: tuple[int, ...]
    """Workers per engine (its tensorParallelSize)."""

    @property
    def world_size(self) -> int:
        return 1 + sum(self.engine_world_sizes)

    def engine_init_info(self, engine: int) -> dict[str, Any]:
        """vLLM's ``NCCLWeightTransferInitInfo`` for engine ``engine`` (``LLM.init_weight_transfer_engine``)."""
        return {
            "master_address": self.master_address,
            "master_port": self.master_port,
            "rank_offset": 1 + sum(self.engine_world_sizes[:engine]),
            "world_size": self.world_size,
        }


def new_broadcast_group(engine_world_sizes: Sequence[int]) -> BroadcastGroup:
    """A rendezvous address on this node (call it on trainer rank 0)."""
    return BroadcastGroup(node_ip(), free_port(), tuple(int(w) for w in engine_world_sizes))


class WeightBroadcaster:
    """Trainer side of the ``separate`` path.

    ``engines`` are the rollout Ray actors (:class:`kuberl.trainer.rollout.vllm.VLLMEngineActor`). Construct it on
    every trainer rank with the same arguments. ``transport`` comes from the rollout layout
    (:mod:`kuberl.trainer.plan.layout`): ``nccl`` when engines hold GPUs of their own (rank 0 opens a
    communicator with them and broadcasts; ``group`` says where it meets), ``ipc`` when engine ``i`` shares trainer
    rank ``i``'s GPU (every rank shares a CUDA IPC handle to its packed buffer; the handles are merged on rank 0,
    and each engine maps the buffer that lives on its own GPU). Only rank 0 talks to the engines; the other ranks
    take part in the FSDP gathers (and, for ``ipc``, the handle exchange) of :meth:`send`.
    """

    def __init__(
        self,
        engines: Sequence[Any],
        *,
        rank: int,
        transport: Transport,
        group: BroadcastGroup | None = None,
        bucket_mb: int = DEFAULT_BUCKET_MB,
    ) -> None:
        if transport not in VLLM_TRANSPORTS:
            raise ValueError(f"weight transport must be one of {VLLM_TRANSPORTS}, got {transport!r}")
        if transport == "nccl" and group is None:
            raise ValueError("the nccl transport needs the BroadcastGroup where trainer rank 0 meets the engines")
        self.engines = list(engines)
        self.rank = rank
        self.transport = transport
        self.group = group
        self.bucket_bytes = bucket_mb * 1024 * 1024
        self.communicator = None
        if rank != 0 or transport != "nccl":
            return
        import ray
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        assert group is not None  # refused above for nccl
        if len(self.engines) != len(group.engine_world_sizes):
            raise ValueError(f"{len(self.engines)} engines but the group was made for {len(group.engine_world_sizes)}")
        # Both sides block in the rendezvous: start the engines' side first, then join.
        pending = [e.init_weight_transfer.remote(group.engine_init_info(i)) for i, e in enumerate(self.engines)]
        self.communicator = NCCLWeightTransferEngine.trainer_init(
            {"master_address": group.master_address, "master_port": group.master_port, "world_size": group.world_size}
        )
        ray.get(pending)

    def _on_engines(self, method: str, *args: Any) -> list[Any]:
        import ray

        return ray.get([getattr(e, method).remote(*args) for e in self.engines])

    def send(self, named: Iterable[tuple[str, Tensor]], metadata: Sequence[ParamMeta], *, version: int) -> None:
        """Send ``named`` (full tensors on this rank's GPU, in ``metadata``'s order) to every engine, which then
        holds weights ``version``.

        Called on every trainer rank with the same iterator (it drives the FSDP gathers).
        """
        expected = iter(metadata)

        def checked() -> Iterator[tuple[str, Tensor]]:
            for name, tensor in named:
                meta = next(expected, None)
                if meta is None or meta.name != name or tuple(tensor.shape) != meta.shape:
                    raise RuntimeError(
                        f"weight stream out of step with its metadata at {name!r} "
                        f"(expected {meta}); the engines are left waiting for the weights"
                    )
                yield name, tensor.to(meta.dtype).contiguous()

        if self.rank == 0:
            self._on_engines("start_weight_update")
        if self.transport == "ipc":
            self._send_ipc(checked())
        elif self.rank == 0:
            self._send_nccl(checked(), metadata)
        else:
            for _ in named:
                pass
        if self.rank == 0:
            self._on_engines("finish_weight_update", version)

    def _send_nccl(self, named: Iterator[tuple[str, Tensor]], metadata: Sequence[ParamMeta]) -> None:
        import ray
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        packing = {"packed": True, "packed_buffer_size_bytes": self.bucket_bytes, "packed_num_buffers": 2}
        update_info = {
            "names": [m.name for m in metadata],
            "dtype_names": [str(m.dtype).removeprefix("torch.") for m in metadata],
            "shapes": [list(m.shape) for m in metadata],
            **packing,
        }
        pending = [e.update_weights.remote(update_info) for e in self.engines]
        NCCLWeightTransferEngine.trainer_send_weights(named, {"group": self.communicator, **packing})
        torch.cuda.synchronize()
        ray.get(pending)

    def _send_ipc(self, named: Iterator[tuple[str, Tensor]]) -> None:
        from dataclasses import asdict

        from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

        # vLLM packs the stream into one reusable buffer of bucket_mb and calls deliver once per filled buffer,
        # on rank 0 only, after all-gathering every rank's handle (a collective over the trainer's group).
        def deliver(update_info: Any) -> None:
            self._on_engines("update_weights", asdict(update_info))

        IPCWeightTransferEngine.trainer_send_weights(
            named, {"send_mode": deliver, "packed": True, "packed_buffer_size_bytes": self.bucket_bytes}
        )

    def send_fsdp(
        self, model: nn.Module, *, version: int, dtype: torch.dtype = torch.bfloat16, lora_scaling: float | None = None
    ) -> list[int]:
        """:meth:`send` of an FSDP2 model's full weights. An engine lost mid-send fails the NCCL group or the IPC
        load and raises: no engine is reported lost (the returned list is always empty)."""
        metadata = fsdp_param_metadata(model, dtype=dtype, lora=lora_scaling is not None)
        named = rollout_named_tensors(
            full_named_parameters(model, lora_scaling=lora_scaling), tied=is_tied(_base(model))
        )
        self.send(named, metadata, version=version)
        return []


class ObjectStoreSender:
    """Trainer side of the ``separate`` path for CPU engines (``rollout.engine hf``): rank 0 puts the full state
    dict into the Ray object store once and every engine loads it from there (no NCCL on CPU, no CUDA IPC). The
    other ranks take part in the FSDP gathers only. Same construction and :meth:`send_fsdp` as
    :class:`WeightBroadcaster`; an engine that died is reported, not raised (the pool it belonged to drops it)."""

    def __init__(self, engines: Sequence[Any], *, rank: int) -> None:
        self.engines = list(engines)
        self.rank = rank

    def send_fsdp(
        self, model: nn.Module, *, version: int, dtype: torch.dtype = torch.float32, lora_scaling: float | None = None
    ) -> list[int]:
        """The indices of the engines that died before they loaded the weights (on rank 0; empty elsewhere)."""
        import ray

        named = rollout_named_tensors(
            full_named_parameters(model, lora_scaling=lora_scaling), tied=is_tied(_base(model)), dtype=dtype
        )
        if self.rank != 0:
            for _ in named:
                pass
            return []
        state = ray.put({name: tensor.detach().cpu().clone() for name, tensor in named})
        loads = [e.load_weights.remote(state, version) for e in self.engines]
        lost = []
        for index, load in enumerate(loads):
            try:
                ray.get(load)
            except ray.exceptions.RayActorError:
                lost.append(index)
        return lost
