"""Metric sinks: JSONL lines, Prometheus series with the rljob label, the console line, timers, the plot."""

import json
import urllib.request

import pytest

from kuberl.trainer.observe.metrics import (
    MetricsLogger,
    PrometheusSink,
    Timer,
    prometheus_name,
    prometheus_series,
    read_jsonl,
    summary_line,
)

STEP = {
    "critic/score/mean": 0.25,
    "actor/kl_loss": 0.001,
    "actor/entropy": 3.5,
    "response_length/mean": 4.0,
    "timing_s/step": 2.0,
    "perf/time_per_step": 2.0,
    "perf/total_num_tokens": 1000.0,
    "val-core/kuberl/digits/reward/mean@1": 0.5,
    "gpu/0/utilization": 87.0,
}


def test_prometheus_names_replace_every_separator():
    assert prometheus_name("actor/pg_loss") == "kuberl_actor_pg_loss"
    assert prometheus_name("response_length/clip_ratio") == "kuberl_response_length_clip_ratio"


@pytest.mark.parametrize(
    ("key", "value", "series"),
    [
        ("timing_s/update_actor", 2.5, ("kuberl_timing_update_actor_seconds", {}, 2.5)),
        ("perf/time_per_step", 79.0, ("kuberl_perf_time_per_step_seconds", {}, 79.0)),
        ("perf/max_memory_allocated_gb", 1.5, ("kuberl_perf_max_memory_allocated_bytes", {}, 1.5 * 2**30)),
        ("gpu/3/utilization", 87.0, ("kuberl_gpu_utilization_ratio", {"gpu": "3"}, 0.87)),
        ("gpu/3/memory_used_gb", 2.0, ("kuberl_gpu_memory_used_bytes", {"gpu": "3"}, 2.0 * 2**30)),
        ("perf/mfu/actor", 0.31, ("kuberl_perf_mfu_actor_ratio", {}, 0.31)),
        ("perf/throughput", 2547.0, ("kuberl_perf_throughput_tokens_per_second", {}, 2547.0)),
        (
            "val-core/openai/gsm8k/reward/mean@4",
            0.5,
            ("kuberl_val_core_reward_mean", {"data_source": "openai/gsm8k", "n": "4"}, 0.5),
        ),
        ("actor/pg_loss", -0.01, ("kuberl_actor_pg_loss", {}, -0.01)),
    ],
)
def test_prometheus_series_are_in_base_units_with_what_varies_as_labels(key, value, series):
    name, labels, converted = prometheus_series(key, value)
    assert (name, labels) == series[:2]
    assert converted == pytest.approx(series[2])


def test_jsonl_sink_writes_one_line_per_step(tmp_path):
    logger = MetricsLogger(tmp_path, loggers=["jsonl"], rljob="job", namespace="ns", metrics_port=0, total_steps=3)
    logger.log(1, STEP)
    logger.log(2, {**STEP, "critic/score/mean": 0.5})
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["step"] == 2 and json.loads(lines[1])["critic/score/mean"] == 0.5
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["actor/entropy"] == 3.5


def test_jsonl_sink_appends_after_a_restart(tmp_path):
    for step in (1, 2):
        logger = MetricsLogger(tmp_path, loggers=["jsonl"], rljob="j", namespace="n", metrics_port=0, total_steps=2)
        logger.log(step, STEP)
        logger.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_prometheus_text_has_kuberl_series_labelled_with_the_rljob():
    sink = PrometheusSink(0, rljob="tiny-cpu", namespace="team-a", total_steps=30)
    sink.log(7, STEP)
    text = sink.text()
    assert 'kuberl_critic_score_mean{namespace="team-a",rljob="tiny-cpu"} 0.25' in text
    assert 'kuberl_step{namespace="team-a",rljob="tiny-cpu"} 7.0' in text
    assert 'kuberl_total_steps{namespace="team-a",rljob="tiny-cpu"} 30.0' in text
    assert 'kuberl_gpu_utilization_ratio{gpu="0",namespace="team-a",rljob="tiny-cpu"} 0.87' in text
    assert (
        'kuberl_val_core_reward_mean{data_source="kuberl/digits",n="1",namespace="team-a",rljob="tiny-cpu"} 0.5' in text
    )


def test_prometheus_endpoint_serves_the_series(tmp_path):
    logger = MetricsLogger(
        tmp_path, loggers=[], rljob="served", namespace="default", metrics_port=free_port(), total_steps=5
    )
    try:
        assert logger.prometheus is not None
        logger.log(1, STEP)
        body = urllib.request.urlopen(f"http://127.0.0.1:{logger.prometheus.port}/metrics", timeout=10).read().decode()
        assert 'kuberl_actor_entropy{namespace="default",rljob="served"} 3.5' in body
    finally:
        logger.close()


def test_a_taken_prometheus_port_does_not_stop_training(tmp_path):
    first = MetricsLogger(tmp_path, loggers=[], rljob="a", namespace="n", metrics_port=free_port(), total_steps=1)
    try:
        second = MetricsLogger(
            tmp_path, loggers=["jsonl"], rljob="b", namespace="n", metrics_port=first.prometheus.port, total_steps=1
        )
        assert second.prometheus is None
        second.log(1, STEP)
        second.close()
    finally:
        first.close()


def test_console_line_shows_the_step_summary():
    line = summary_line(3, 30, STEP)
    for part in (
        "step 3/30",
        "reward 0.250",
        "kl 0.0010",
        "entropy 3.500",
        "resp_len 4.0",
        "2.00 s",
        "500 tok/s",
        "kuberl/digits/reward/mean@1 0.500",
    ):
        assert part in line


def test_console_sink_writes_through_the_given_function(tmp_path):
    lines: list[str] = []
    logger = MetricsLogger(
        tmp_path, loggers=["console"], rljob="j", namespace="n", metrics_port=0, total_steps=9, write=lines.append
    )
    logger.log(1, STEP)
    assert len(lines) == 1 and lines[0].startswith("step 1/9")


def test_tensorboard_sink_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    logger = MetricsLogger(tmp_path, loggers=["tensorboard"], rljob="j", namespace="n", metrics_port=0, total_steps=1)
    logger.log(1, STEP)
    logger.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_timer_accumulates_phases():
    timer = Timer()
    with timer("gen"):
        pass
    with timer("gen"):
        pass
    assert set(timer.metrics()) == {"timing_s/gen"} and timer.metrics()["timing_s/gen"] >= 0


def test_plot_writes_a_png(tmp_path):
    from kuberl.trainer.observe.plot import plot_run

    logger = MetricsLogger(tmp_path, loggers=["jsonl"], rljob="j", namespace="n", metrics_port=0, total_steps=3)
    for step in (1, 2, 3):
        logger.log(step, {**STEP, "perf/throughput": 100.0 * step})
    logger.close()
    out = plot_run(tmp_path)
    assert out == tmp_path / "metrics.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_gpu_sampler_averages_the_readings_of_a_step_and_restarts_at_each_take():
    """Readings alternate busy (100) and idle (0) as a step does: the step's figures are their mean and largest
    reading, not the last one."""
    import itertools
    import time

    from kuberl.trainer.observe.metrics import GPUSampler

    readings = itertools.cycle([100.0, 0.0])
    sampler = GPUSampler(lambda: next(readings), interval=0.01)
    try:
        time.sleep(0.3)
        samples = sampler.take()
        assert samples is not None and 30 < samples.mean < 70 and samples.max == 100.0
        sampler.close()
        sampler.take()
        assert sampler.take() is None  # nothing read since the last take
    finally:
        sampler.close()


def test_gpu_sampler_stops_when_the_reading_fails():
    from kuberl.trainer.observe.metrics import GPUSampler

    def broken() -> float:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    sampler = GPUSampler(broken, interval=0.01)
    sampler._thread.join(timeout=5)
    assert not sampler._thread.is_alive() and sampler.take() is None
