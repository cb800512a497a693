"""A real Prometheus scrapes the operator, the trainer and a GPU node's exporters; every PromQL query of every
dashboard panel, with Grafana's variables substituted, must return at least one series.

Scrape targets (static configs whose labels are what the chart's PodMonitor/ServiceMonitor relabelling gives):
- the operator: `python -m kuberl.operator` against the harness's apiserver (its /metrics);
- the trainer: its Prometheus sink (`kuberl.trainer.observe.metrics.PrometheusSink`) fed one step of an 8-GPU GRPO run;
  the slow test instead scrapes a real `kuberl run` of examples/tiny-cpu.yaml;
- a GPU node: the recorded dcgm-exporter sample `dcgm-sample.prom` (8 GPUs of the RLJob's worker pod, one GPU of
  another team, one unassigned) and Ray's metrics port of the worker pod (`ray-sample.prom`), each served by a
  tiny HTTP server.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness import Cluster, free_port
from e2e.prometheus import INSTALL_HINT, Prometheus, PrometheusMissing, ScrapeJob, find_prometheus

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DASHBOARDS = REPO / "charts" / "kuberl" / "dashboards"
FALLBACK = "\nor on (rljob)\n"  # how generate.py chains a DCGM query with its NVML and Ray fallbacks

JOB, JOB_NAMESPACE = "gsm8k-grpo", "rl-team"
HEAD_POD, WORKER_POD = "gsm8k-grpo-7xk2p-head-5vfbl", "gsm8k-grpo-7xk2p-trainer-worker-q8n4z"
OPERATOR_NAMESPACE = "kuberl-system"

# One step of an 8×H100 GRPO run on GSM8K, as the trainer logs it (verl's names; gpu/<rank>/* from NVML).
STEP: dict[str, float] = {
    "critic/score/mean": 0.62,
    "critic/score/max": 1.0,
    "critic/score/min": 0.0,
    "critic/rewards/mean": 0.61,
    "critic/advantages/mean": 0.0,
    "actor/kl_loss": 0.0021,
    "actor/reward_kl_penalty": 0.0004,
    "actor/entropy": 0.41,
    "actor/pg_loss": -0.013,
    "actor/pg_clipfrac": 0.004,
    "actor/ppo_kl": 0.0002,
    "actor/grad_norm": 0.31,
    "actor/lr": 1e-6,
    "response_length/mean": 212.5,
    "response_length/max": 1024.0,
    "response_length/min": 31.0,
    "response_length/clip_ratio": 0.012,
    "prompt_length/mean": 104.2,
    "timing_s/gen": 41.3,
    "timing_s/reward": 0.4,
    "timing_s/old_log_prob": 6.1,
    "timing_s/ref": 5.8,
    "timing_s/adv": 0.1,
    "timing_s/update_actor": 22.7,
    "timing_s/update_weights": 2.2,
    "timing_s/step": 79.0,
    "rollout/staleness": 0.0,
    "rollout/engines": 8.0,
    "perf/total_num_tokens": 1.61e6,
    "perf/time_per_step": 79.0,
    "perf/throughput": 2547.0,
    "perf/mfu/actor": 0.31,
    "perf/max_memory_allocated_gb": 61.2,
    "perf/max_memory_reserved_gb": 70.4,
    "perf/engine_pool_gb": 23.5,  # the colocated engine's, inside the two above
    "val-core/openai/gsm8k/reward/mean@1": 0.58,
    **{f"gpu/{rank}/utilization": 90.0 + rank for rank in range(8)},
    **{f"gpu/{rank}/memory_used_gb": 70.0 + rank / 10 for rank in range(8)},
}


# ---- helpers ---------------------------------------------------------------------------------------------------


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (f"{p['title']} [{t['refId']}]", t["expr"])
        for p in dashboard["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    ]


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's interpolation for the variables our dashboards use ($1 etc. in label_replace stay as they are)."""
    values = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", **variables}
    return re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), m.group(0)), expr)


def variable_query(dashboard: dict[str, Any], name: str) -> str:
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    return variable["definition"]


def label_values(prom: Prometheus, definition: str, variables: dict[str, str], at: float | None) -> list[str]:
    """Grafana's `label_values(selector, label)` as Prometheus's series API answers it."""
    match = re.fullmatch(r"label_values\((.+), (\w+)\)", substitute(definition, variables))
    assert match, definition
    selector, label = match.groups()
    params = {"match[]": [selector]}
    if at is not None:
        params |= {"start": str(at - 60), "end": str(at)}
    return sorted({s[label] for s in prom.api("series", params) if label in s})


def query(prom: Prometheus, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr}
    if at is not None:
        params["time"] = str(at)
    data = prom.api("query", params)
    return data["result"] if isinstance(data["result"], list) else [data["result"]]


class _Static(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def serve_file(path: Path) -> http.server.ThreadingHTTPServer:
    """A recorded exposition file as a scrape target on a free loopback port."""
    handler = type("Recorded", (_Static,), {"body": path.read_bytes()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def address(server: http.server.HTTPServer) -> str:
    return f"127.0.0.1:{server.server_address[1]}"


def wait_http(url: str, timeout: float = 60, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited {proc.returncode}:\n{log.read_text()[-3000:] if log else ''}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not serving after {timeout:.0f} s")


# ---- fixtures --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus_bin() -> Path:
    try:
        return find_prometheus()
    except PrometheusMissing as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{exc} (CI=true: `{INSTALL_HINT}` must run before pytest)", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, str]]:
    servers = {"dcgm": serve_file(HERE / "dcgm-sample.prom"), "ray": serve_file(HERE / "ray-sample.prom")}
    yield {name: address(server) for name, server in servers.items()}
    for server in servers.values():
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real operator process watching one namespace, with RLJobs that make its handlers run (one fails)."""
    namespace = "t-prometheus-operator"
    cluster.kubectl("create", "namespace", namespace)
    port, health = free_port(), free_port()
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kuberl.operator",
                "--namespace",
                namespace,
                f"--metrics-port={port}",
                f"--health-port={health}",
                "--resync-seconds=1",
            ],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", proc=proc, log=log)
        wait_http(f"http://127.0.0.1:{health}/healthz", proc=proc, log=log)
        rljob_crd_ok = not any(p.name == "rljob.yaml" for p in cluster.crd_errors)
        if rljob_crd_ok:
            good = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
            # a volume named like the operator's own: the create handler fails (a reconcile error)
            clash = copy.deepcopy(good)
            clash["metadata"]["name"] = "volume-clash"
            clash["spec"]["cluster"]["volumes"] = [{"name": "kuberl-spec", "emptyDir": {}}]
            cluster.create([good, clash], namespace=namespace)
        # else: the resync loop's list of rljobs fails every second (no CRD), which also moves the counters
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def trainer_sink() -> Iterator[str]:
    from kuberl.trainer.observe.metrics import PrometheusSink

    sink = PrometheusSink(free_port(), rljob=JOB, namespace=JOB_NAMESPACE, total_steps=200, addr="127.0.0.1")
    sink.log(37, STEP)
    yield f"127.0.0.1:{sink.port}"
    sink.close()


def scrape_jobs(
    operator: str, trainer: str, exporters: dict[str, str], *, dcgm_honor_labels: bool, trainer_labels: dict[str, str]
) -> list[ScrapeJob]:
    return [
        # ServiceMonitor kuberl-operator -> Service kuberl-metrics, port metrics
        ScrapeJob(
            "kuberl-metrics",
            [operator],
            labels={
                "namespace": OPERATOR_NAMESPACE,
                "service": "kuberl-metrics",
                "endpoint": "metrics",
                "pod": "kuberl-6c9f8d7b5-x2kqp",
                "container": "operator",
            },
        ),
        # PodMonitor kuberl-rljobs, endpoint trainer-metrics (honorLabels) on the head pod
        ScrapeJob(
            "kuberl-system/kuberl-rljobs",
            [trainer],
            honor_labels=True,
            labels={"endpoint": "trainer-metrics", "container": "ray-head", **trainer_labels},
        ),
        # PodMonitor kuberl-rljobs, endpoint metrics (Ray) on the trainer worker pod
        ScrapeJob(
            "kuberl-system/kuberl-rljobs-ray",
            [exporters["ray"]],
            labels={
                "namespace": JOB_NAMESPACE,
                "pod": WORKER_POD,
                "container": "ray-worker",
                "endpoint": "metrics",
                "rljob": JOB,
                "ray_io_cluster": "gsm8k-grpo-7xk2p",
            },
        ),
        # the GPU operator's dcgm-exporter ServiceMonitor; its own pod's labels become exported_* without honorLabels
        ScrapeJob(
            "gpu-operator/nvidia-dcgm-exporter",
            [exporters["dcgm"]],
            honor_labels=dcgm_honor_labels,
            labels={
                "namespace": "gpu-operator",
                "pod": "nvidia-dcgm-exporter-8wq4n",
                "service": "nvidia-dcgm-exporter",
                "container": "nvidia-dcgm-exporter",
                "endpoint": "gpu-metrics",
            },
        ),
    ]


def variables_for(name: str, namespace: str, rljob: str) -> dict[str, str]:
    return {"namespace": OPERATOR_NAMESPACE if name == "operator" else namespace, "rljob": rljob}


# ---- tests -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dcgm_honor_labels", [True, False], ids=["dcgm-honor-labels", "dcgm-exported-labels"])
def test_every_dashboard_query_returns_data(
    prometheus_bin: Path, operator: str, trainer_sink: str, exporters: dict[str, str], dcgm_honor_labels: bool
):
    jobs = scrape_jobs(
        operator,
        trainer_sink,
        exporters,
        dcgm_honor_labels=dcgm_honor_labels,
        trainer_labels={"namespace": JOB_NAMESPACE, "pod": HEAD_POD, "rljob": JOB},
    )
    with Prometheus(jobs, binary=prometheus_bin) as prom:
        prom.wait_for_targets(scrapes=3)
        assert prom.wait_for("kuberl_operator_reconcile_errors_total"), "the operator counted no reconcile error"
        empty, evaluated = [], 0
        for name, dashboard in dashboards().items():
            variables = variables_for(name, JOB_NAMESPACE, JOB)
            for var in ("namespace", "rljob"):
                values = label_values(prom, variable_query(dashboard, var), variables, None)
                if variables[var] not in values:
                    empty.append(f"{name}: variable ${var} offers {values}, not {variables[var]}")
            for title, expr in panel_queries(dashboard):
                # each branch of a DCGM/NVML/Ray fallback chain must work on its own, and the chain as a whole
                for branch in [expr, *expr.split(FALLBACK)] if FALLBACK in expr else [expr]:
                    evaluated += 1
                    if not query(prom, substitute(branch, variables)):
                        empty.append(f"{name} / {title}: {substitute(branch, variables)}")
        assert not empty, "queries without data:\n" + "\n\n".join(empty)
        assert evaluated >= 60  # 50 panel queries + the branches of their fallback chains


def test_gpu_panels_count_only_the_rljobs_gpus(
    prometheus_bin: Path, operator: str, trainer_sink: str, exporters: dict[str, str]
):
    """DCGM's 10 GPUs: 8 in the RLJob's worker pod; another team's GPU and the unassigned one are not the job's."""
    jobs = scrape_jobs(
        operator,
        trainer_sink,
        exporters,
        dcgm_honor_labels=False,
        trainer_labels={"namespace": JOB_NAMESPACE, "pod": HEAD_POD, "rljob": JOB},
    )
    gpu = dashboards()["gpu"]
    by_title = {p["title"]: p for p in gpu["panels"]}
    variables = variables_for("gpu", JOB_NAMESPACE, JOB)
    with Prometheus(jobs, binary=prometheus_bin) as prom:
        prom.wait_for_targets(scrapes=2)
        (in_use,) = query(prom, substitute(by_title["GPUs in use"]["targets"][0]["expr"], variables))
        assert in_use["metric"] == {"rljob": JOB} and float(in_use["value"][1]) == 8
        per_gpu = query(prom, substitute(by_title["GPU utilization"]["targets"][0]["expr"], variables))
        assert sorted((s["metric"]["pod"], s["metric"]["gpu"]) for s in per_gpu) == [
            (WORKER_POD, str(i)) for i in range(8)
        ]
        memory = query(prom, substitute(by_title["GPU memory used"]["targets"][0]["expr"], variables))
        assert all(60 * 2**30 < float(s["value"][1]) < 80 * 2**30 for s in memory)  # MiB -> bytes


# GPU panels, and the validation score: the run validates with testFreq -1 / valBeforeTrain false (no val-core series)
SKIP_ON_CPU = ("GPU", "NVLink", "Tensor", "Temperature", "Power", "XID", "Trainer peak memory", "Validation score")


@pytest.mark.slow
def test_a_real_cpu_training_run_feeds_the_training_dashboard(
    prometheus_bin: Path, operator: str, exporters: dict[str, str], tmp_path: Path
):
    """`kuberl run` of examples/tiny-cpu.yaml (both KL forms, an MFU peak) scraped while it trains.

    The run is given far more steps than the test needs and is interrupted (Ctrl-C) once the dashboard has been
    checked: a run that ended before a scrape would leave nothing to query.
    """
    port = free_port()
    rljob = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    spec = rljob["spec"]
    spec["trainer"] |= {
        "totalSteps": 10_000,
        "testFreq": -1,
        "saveFreq": -1,
        "valBeforeTrain": False,
        "metricsPort": port,
        "checkpointDir": str(tmp_path / "checkpoints"),
    }
    spec["algorithm"]["kl"] = {"inReward": True, "coef": 0.01, "loss": {"enabled": True, "coef": 0.01}}
    spec["data"]["trainFiles"] = [str(REPO / f) for f in spec["data"]["trainFiles"]]
    spec["data"]["valFiles"] = [str(REPO / f) for f in spec["data"]["valFiles"]]
    (tmp_path / "rljob.yaml").write_text(yaml.safe_dump(rljob, sort_keys=False))
    log = tmp_path / "run.log"
    kuberl = Path(sys.executable).with_name("kuberl")
    with open(log, "wb") as out:
        run = subprocess.Popen(
            [str(kuberl), "run", str(tmp_path / "rljob.yaml"), "--run-dir", str(tmp_path / "run"), "--no-progress"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "KUBERL_PEAK_FLOPS": "1e11"},
        )
    name = rljob["metadata"]["name"]
    jobs = scrape_jobs(
        operator,
        f"127.0.0.1:{port}",
        exporters,
        dcgm_honor_labels=True,
        trainer_labels={"pod": f"{name}-head", "rljob": name},
    )
    try:
        with Prometheus(jobs, binary=prometheus_bin) as prom:
            deadline = time.monotonic() + 600
            seen: list[dict[str, Any]] = []
            while time.monotonic() < deadline and run.poll() is None:
                seen = query(prom, f'kuberl_step{{rljob="{name}"}} >= 1')
                if seen:
                    break
                time.sleep(0.5)
            assert seen, f"no step scraped from the trainer; its log:\n{log.read_text()[-3000:]}"
            time.sleep(3)  # a few scrapes of the stepped gauges, all evaluated at this instant
            at = time.time()
            namespace = seen[0]["metric"]["namespace"]
            variables = {"namespace": namespace, "rljob": name}
            empty = []
            training = dashboards()["training"]
            for var in ("namespace", "rljob"):
                if variables[var] not in label_values(prom, variable_query(training, var), variables, at):
                    empty.append(f"variable ${var}")
            for title, expr in panel_queries(training):
                if title.startswith(SKIP_ON_CPU):
                    continue
                if not query(prom, substitute(expr, variables), at):
                    empty.append(f"training / {title}: {substitute(expr, variables)}")
            assert not empty, "queries without data from the real run:\n" + "\n\n".join(empty)
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=300) == 130, log.read_text()[-3000:]  # interrupted: checkpoint saved, exit 130
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait(timeout=30)


# ---- alerts ----------------------------------------------------------------------------------------------------

DIVERGED = "diverged"
ALERT_VALUES = {
    # the chart's own rules, with windows short enough for a test (the expressions are the defaults' otherwise)
    "prometheusRule": {"enabled": True, "stalledAfter": "5s", "gpuIdleFor": "0s", "operatorDownFor": "0s"}
}


def chart_alert_rules(helm_bin: Path, tmp_path: Path) -> dict[str, Any]:
    """The rule groups of the PrometheusRule that `helm template` renders (release kuberl in kuberl-system)."""
    values = tmp_path / "alert-values.yaml"
    values.write_text(yaml.safe_dump(ALERT_VALUES))
    chart = str(REPO / "charts" / "kuberl")
    args = ["template", "kuberl", chart, "--namespace", OPERATOR_NAMESPACE, "--values", str(values)]
    out = subprocess.run(
        [str(helm_bin), *args, "--show-only", "templates/prometheusrule.yaml"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HELM_CONFIG_HOME": str(tmp_path / "helm"), "HELM_CACHE_HOME": str(tmp_path / "helm")},
    ).stdout
    return {"groups": yaml.safe_load(out)["spec"]["groups"]}


@pytest.fixture
def advancing_trainer() -> Iterator[str]:
    """A healthy trainer: a step every 0.3 s, busy GPUs, finite reward and loss."""
    from kuberl.trainer.observe.metrics import PrometheusSink

    sink = PrometheusSink(free_port(), rljob=JOB, namespace=JOB_NAMESPACE, total_steps=10_000, addr="127.0.0.1")
    stop = threading.Event()

    def train() -> None:
        step = 1
        while not stop.wait(0.3):
            sink.log(step, STEP)
            step += 1

    thread = threading.Thread(target=train, daemon=True)
    sink.log(0, STEP)
    thread.start()
    yield f"127.0.0.1:{sink.port}"
    stop.set()
    thread.join()
    sink.close()


@pytest.fixture
def diverged_trainer() -> Iterator[str]:
    """A broken trainer: stuck at step 5 of 200, NaN loss, +Inf reward, GPUs at 2 %."""
    from kuberl.trainer.observe.metrics import PrometheusSink

    sink = PrometheusSink(free_port(), rljob=DIVERGED, namespace=JOB_NAMESPACE, total_steps=200, addr="127.0.0.1")
    broken = {
        **STEP,
        "actor/pg_loss": float("nan"),
        "critic/score/mean": float("inf"),
        **{f"gpu/{rank}/utilization": 2.0 for rank in range(8)},
    }
    sink.log(5, broken)
    yield f"127.0.0.1:{sink.port}"
    sink.close()


def firing(prom: Prometheus) -> set[tuple[str, str]]:
    """(alertname, rljob or "", and the `metric` of a non-finite series) of every firing alert."""
    alerts = [a["labels"] for a in prom.alerts() if a["state"] == "firing"]
    return {(a["alertname"], a.get("rljob", ""), *([a["metric"]] if "metric" in a else [])) for a in alerts}


def test_each_alert_fires_on_its_fault_and_stays_quiet_on_a_healthy_job(
    prometheus_bin: Path,
    helm_bin: Path,
    operator: str,
    advancing_trainer: str,
    diverged_trainer: str,
    exporters: dict[str, str],
    tmp_path: Path,
):
    """The chart's PrometheusRule on a real Prometheus: the real operator (with a Failed RLJob), a trainer that
    advances and one that diverged. Every rule evaluates without error; exactly the expected alerts fire."""
    rules = chart_alert_rules(helm_bin, tmp_path)
    jobs = scrape_jobs(
        operator,
        advancing_trainer,
        exporters,
        dcgm_honor_labels=True,
        trainer_labels={"namespace": JOB_NAMESPACE, "pod": HEAD_POD, "rljob": JOB},
    )
    jobs.append(
        ScrapeJob(
            "kuberl-system/kuberl-rljobs-diverged",
            [diverged_trainer],
            honor_labels=True,
            labels={"namespace": JOB_NAMESPACE, "pod": "diverged-head", "rljob": DIVERGED},
        )
    )
    expected = {
        ("KuberlRLJobFailed", ""),
        ("KuberlRLJobStalled", DIVERGED),
        ("KuberlGPUsIdle", DIVERGED),
        ("KuberlRLJobNonFinite", DIVERGED, "actor_pg_loss"),
        ("KuberlRLJobNonFinite", DIVERGED, "critic_score_mean"),
    }
    with Prometheus(jobs, binary=prometheus_bin, rules=rules) as prom:
        prom.wait_for_targets(scrapes=2)
        assert prom.wait_for('kuberl_operator_rljobs{phase="Failed"} > 0'), "the operator reported no Failed RLJob"
        deadline = time.monotonic() + 30  # stalledAfter (5 s) of history, then one evaluation
        while firing(prom) != expected and time.monotonic() < deadline:
            time.sleep(0.5)
        assert firing(prom) == expected
        health = prom.rule_health()
        assert sorted(health) == sorted(r["alert"] for g in rules["groups"] for r in g["rules"])
        assert all(h == ("ok", "") for h in health.values()), health


def test_operator_down_fires_when_no_operator_replica_answers(prometheus_bin: Path, helm_bin: Path, tmp_path: Path):
    """The operator's scrape target is a closed port, as when its pods are gone: up == 0."""
    rules = chart_alert_rules(helm_bin, tmp_path)
    dead = ScrapeJob("kuberl-metrics", [f"127.0.0.1:{free_port()}"], labels={"namespace": OPERATOR_NAMESPACE})
    with Prometheus([dead], binary=prometheus_bin, rules=rules) as prom:
        assert prom.wait_for('up{job="kuberl-metrics"} == 0')
        deadline = time.monotonic() + 15
        while ("KuberlOperatorDown", "") not in firing(prom) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert firing(prom) == {("KuberlOperatorDown", "")}
