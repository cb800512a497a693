"""Step metrics with verl's names, and the sinks they go to.

Names follow verl (``timing_s/gen``, ``perf/throughput``, ``actor/pg_loss``, ``critic/score/mean``,
``response_length/mean``, ``val-core/<data_source>/reward/mean@N``, …) so dashboards and habits carry over.

Sinks: the console (one summary line per step), ``<run_dir>/metrics.jsonl`` (one JSON object per step),
Prometheus, TensorBoard and W&B (offline mode) when ``trainer.loggers`` asks for them.

Prometheus names (`prometheus_series`) follow Prometheus's conventions: ``kuberl_<key>`` with every separator as
``_``, in base units with the unit as suffix, and what varies as a label rather than in the name:

- ``timing_s/<phase>`` → ``kuberl_timing_<phase>_seconds``; ``perf/time_per_step`` → ``..._seconds``;
- ``*_gb`` (GiB) → ``*_bytes``; ``gpu/<rank>/utilization`` (NVML percent) → ``kuberl_gpu_utilization_ratio``;
  ``perf/mfu/<role>`` → ``kuberl_perf_mfu_<role>_ratio``; ``perf/throughput`` → ``..._tokens_per_second``;
- ``gpu/<rank>/<stat>`` → ``kuberl_gpu_<stat>{gpu="<rank>"}``;
- ``val-core/<data_source>/<var>/<stat>@<n>`` → ``kuberl_val_core_<var>_<stat>{data_source=..., n="<n>"}``.

Every series is labelled ``rljob`` and ``namespace``; ``kuberl_step`` and ``kuberl_total_steps`` carry progress.
The names before 0.2 (``kuberl_timing_s_gen``, ``kuberl_gpu_utilization`` in percent,
``kuberl_val_core_<data_source>_reward_mean_<n>``, …) are gone: docs/observability.md lists old → new.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kuberl.api.spec import Tracking
from kuberl.trainer.observe.tracking import MlflowSink, WandbSink, params_of

log = logging.getLogger(__name__)

GPU_KEY = re.compile(r"^gpu/(\d+)/(\w+)$")
VAL_KEY = re.compile(r"^(val-(?:core|aux))/(.+)/([^/]+)/([^/@]+)(?:@(\d+))?$")
GIB = 2**30


def prometheus_name(metric: str) -> str:
    """``actor/pg_loss`` → ``kuberl_actor_pg_loss``; anything outside ``[a-zA-Z0-9_]`` becomes ``_``."""
    return "kuberl_" + re.sub(r"_+", "_", re.sub(r"[^a-zA-Z0-9_]", "_", metric)).strip("_")


def prometheus_series(key: str, value: float) -> tuple[str, dict[str, str], float]:
    """verl's metric key → (Prometheus name in base units, labels beyond rljob/namespace, value in that unit)."""
    labels: dict[str, str] = {}
    if gpu := GPU_KEY.match(key):
        labels["gpu"] = gpu.group(1)
        key = f"gpu/{gpu.group(2)}"
    elif val := VAL_KEY.match(key):
        prefix, data_source, var, stat, n = val.groups()
        labels["data_source"] = data_source
        if n is not None:
            labels["n"] = n
        key = f"{prefix}/{var}/{stat}"
    if key.startswith("timing_s/"):
        return f"{prometheus_name('timing/' + key.removeprefix('timing_s/'))}_seconds", labels, value
    name = prometheus_name(key)
    if name.endswith("_gb"):
        return name.removesuffix("_gb") + "_bytes", labels, value * GIB
    if key == "gpu/utilization":
        return f"{name}_ratio", labels, value / 100
    if key.startswith("perf/mfu/"):
        return f"{name}_ratio", labels, value
    if key == "perf/time_per_step":
        return f"{name}_seconds", labels, value
    if key == "perf/throughput":
        return f"{name}_tokens_per_second", labels, value
    return name, labels, value


class Timer:
    """``with timer("gen"):`` accumulates wall seconds under ``timing_s/gen``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


@dataclass(frozen=True)
class Samples:
    mean: float
    max: float


class GPUSampler:
    """A value (NVML utilization, memory in use) read every `interval` seconds in a daemon thread; `take()` gives the
    mean and the largest reading since the last take, so a step's figure covers the whole step and not the instant it
    ended at (when the GPU is often idle, waiting for the driver, and a colocated engine asleep)."""

    def __init__(self, read: Callable[[], float], interval: float = 0.5) -> None:
        import threading

        self.read = read
        self.interval = interval
        self._lock = threading.Lock()
        self._sum, self._count, self._max = 0.0, 0, float("-inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kuberl-gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                value = float(self.read())
            except Exception as exc:  # NVML gone (driver reset): stop sampling, the step metrics go on without it
                log.warning("GPU sampler stopped: %s", exc)
                return
            with self._lock:
                self._sum, self._count, self._max = self._sum + value, self._count + 1, max(self._max, value)
            self._stop.wait(self.interval)

    def take(self) -> Samples | None:
        """Mean and largest reading since the previous take (None when no sample was read in between)."""
        with self._lock:
            samples = Samples(self._sum / self._count, self._max) if self._count else None
            self._sum, self._count, self._max = 0.0, 0, float("-inf")
        return samples

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


_NVML_SAMPLERS: dict[tuple[int, str], GPUSampler] = {}


def nvml_sampler(index: int, quantity: Literal["utilization", "memory_used"]) -> GPUSampler:
    """One sampler per GPU index, quantity and process, started on first use (raises when NVML is unavailable):
    utilization in percent, or the bytes in use on the device by every allocator (torch's, vLLM's, NCCL's, the CUDA
    context), which torch's own counters do not see whole."""
    if (index, quantity) not in _NVML_SAMPLERS:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        readers: dict[str, Callable[[], float]] = {
            "utilization": lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory_used": lambda: float(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
        }
        _NVML_SAMPLERS[index, quantity] = GPUSampler(readers[quantity])
    return _NVML_SAMPLERS[index, quantity]


def summary_line(step: int, total_steps: int, m: dict[str, float]) -> str:
    """The console line: step, reward, KL, entropy, response length, step time, tokens/s."""

    def fmt(key: str, digits: int = 3) -> str:
        value = m.get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    kl_key = next((k for k in ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl") if k in m), "actor/kl_loss")
    tokens_per_s = m["perf/total_num_tokens"] / m["perf/time_per_step"] if m.get("perf/time_per_step") else None
    parts = [
        f"step {step}/{total_steps}",
        f"reward {fmt('critic/score/mean')}",
        f"kl {fmt(kl_key, 4)}",
        f"entropy {fmt('actor/entropy')}",
        f"resp_len {fmt('response_length/mean', 1)}",
        f"{fmt('timing_s/step', 2)} s",
        f"{tokens_per_s:.0f} tok/s" if tokens_per_s else "- tok/s",
    ]
    val = [f"{k.split('/', 1)[1]} {v:.3f}" for k, v in m.items() if k.startswith("val-core/")]
    return " | ".join(parts + val)


class JsonlSink:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}, sort_keys=True) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class ConsoleSink:
    def __init__(self, total_steps: int, write: Callable[[str], None] = print) -> None:
        self.total_steps = total_steps
        self.write = write

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.write(summary_line(step, self.total_steps, metrics))

    def close(self) -> None:
        pass


class PrometheusSink:
    """Gauges on an HTTP endpoint (``prometheus_client.start_http_server``), one registry per run."""

    def __init__(self, port: int, *, rljob: str, namespace: str, total_steps: int, addr: str = "0.0.0.0") -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.labels = {"rljob": rljob, "namespace": namespace}
        self.gauges: dict[str, Any] = {}
        self._gauge = Gauge
        self.server = None
        self.port = port
        if port:
            self.server, _ = start_http_server(port, addr=addr, registry=self.registry)
            self.port = self.server.server_port
        self.set("kuberl_total_steps", "Training steps this run will make.", total_steps)

    def set(self, name: str, doc: str, value: float, extra: dict[str, str] | None = None) -> None:
        labels = {**self.labels, **(extra or {})}
        gauge = self.gauges.get(name)
        if gauge is None:
            gauge = self._gauge(name, doc, list(labels), registry=self.registry)
            self.gauges[name] = gauge
        gauge.labels(**labels).set(float(value))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.set("kuberl_step", "Training steps completed.", step)
        for key, value in metrics.items():
            name, labels, converted = prometheus_series(key, value)
            self.set(name, f"{key} (base units)", converted, labels)

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class TensorBoardSink:
    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


RUN_RECORD = "rljob.json"


def write_run_record(run_dir: Path, rljob: str, namespace: str, config: dict[str, Any]) -> None:
    """``rljob.json`` beside ``metrics.jsonl``: what `kuberl plot` titles with and where `kuberl export` finds the
    checkpoints of a run folder (checkpointDir made absolute, as the run's working directory is not recorded)."""
    checkpoint_dir = config.get("trainer", {}).get("checkpointDir")
    record = {
        "name": rljob,
        "namespace": namespace,
        "checkpointDir": str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None,
        "spec": config,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


class MetricsLogger:
    """Fans a step's metrics out to every configured sink; a failing optional sink is logged, not fatal."""

    def __init__(
        self,
        run_dir: Path,
        *,
        loggers: Sequence[str],
        rljob: str,
        namespace: str,
        metrics_port: int,
        total_steps: int,
        write: Callable[[str], None] = print,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.sinks: list[Any] = []
        self.prometheus: PrometheusSink | None = None
        if "console" in loggers:
            self.sinks.append(ConsoleSink(total_steps, write))
        if "jsonl" in loggers:
            self.sinks.append(JsonlSink(run_dir / "metrics.jsonl"))
            write_run_record(run_dir, rljob, namespace, config or {})
        optional: list[tuple[str, Callable[[], Any]]] = [
            (
                "prometheus",
                lambda: PrometheusSink(metrics_port, rljob=rljob, namespace=namespace, total_steps=total_steps),
            ),
        ]
        if "tensorboard" in loggers:
            optional.append(("tensorboard", lambda: TensorBoardSink(run_dir / "tensorboard")))
        tracking = Tracking.model_validate((config or {}).get("trainer", {}).get("tracking", {}))
        if "wandb" in loggers:
            optional.append(("wandb", lambda: WandbSink(run_dir, rljob, tracking, config or {})))
        if "mlflow" in loggers:
            optional.append(("mlflow", lambda: MlflowSink(rljob, namespace, tracking, params_of(config or {}))))
        for name, make in optional:
            if name == "prometheus" and metrics_port == 0:
                continue
            try:
                sink = make()
            except Exception as exc:  # port taken, package missing: keep training
                log.warning("metrics sink %s disabled: %s", name, exc)
                continue
            self.sinks.append(sink)
            if isinstance(sink, PrometheusSink):
                self.prometheus = sink

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        for sink in self.sinks:
            try:
                sink.log(step, clean)
            except Exception as exc:
                log.warning("metrics sink %s failed: %s", type(sink).__name__, exc)

    def close(self) -> None:
        for sink in self.sinks:
            with contextlib.suppress(Exception):
                sink.close()


def read_jsonl(path: str | Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
