"""The cluster commands: `kuberl submit | status | logs | stop | resume` and `kuberl crd --apply`.

Each takes --kubeconfig, --context and -n/--namespace as kubectl does; the kubernetes client is imported when a
command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from kuberl.api.cli_options import add_format_option
from kuberl.api.contract import GROUP, RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, RLJOB_LABEL, SPEC_FILE
from kuberl.api.overrides import add_set_argument
from kuberl.api.status import Phase
from kuberl.cluster.kube import FIELD_MANAGER, ClusterError, Target, api_error, connect, get_rljob, patch_rljob
from kuberl.cluster.logs import LogUnavailable, head_template, log_path, reader_pod, spec_configmap
from kuberl.cluster.view import is_terminal, phase_of, progress_line, status_text

Handler = Callable[[argparse.Namespace], int]
FOLLOW_PERIOD_SECONDS = 2.0
EXIT_INTERRUPTED = 130


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = sub.add_parser(
        "submit",
        help="validate an RLJob file and apply it to the cluster (server-side apply); --follow streams its progress",
    )
    submit.add_argument("file", help="RLJob YAML; other kinds in the file (claims) are applied too")
    add_set_argument(submit)
    submit.add_argument("--follow", "-f", action="store_true", help="print progress until the job ends")
    submit.add_argument("--force-conflicts", action="store_true", help="take over fields another manager (kubectl) set")
    _add_target(submit, run_submit)

    status = sub.add_parser("status", help="an RLJob's phase, step, reward, ETA, conditions with reasons, and pods")
    status.add_argument("name", help="the RLJob")
    status.add_argument("--watch", "-w", action="store_true", help="print a line on each change until it ends")
    add_format_option(status)
    _add_target(status, run_status)

    logs = sub.add_parser(
        "logs",
        help="the trainer's output (the driver's log on the checkpoint claim), also after the head pod restarted",
    )
    logs.add_argument("name", help="the RLJob")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends (Ctrl-C stops)")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    logs.add_argument("--timeout", type=float, default=300.0, help="seconds the reader pod may take to start")
    _add_target(logs, run_logs)

    for verb, help_text in (
        ("stop", "suspend an RLJob: its pods stop after saving a checkpoint; `kuberl resume` continues from it"),
        ("resume", "resume a suspended RLJob from its last checkpoint"),
    ):
        parser = sub.add_parser(verb, help=help_text)
        parser.add_argument("name", help="the RLJob")
        parser.add_argument("--no-wait", action="store_true", help="return once the change is accepted")
        parser.add_argument(
            "--timeout", type=float, default=900.0, help="seconds to wait for the new phase (default 900)"
        )
        _add_target(parser, run_stop if verb == "stop" else run_resume)


def add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default the current one)")
    parser.add_argument("-n", "--namespace", help="namespace (default the context's, else default)")


def _add_target(parser: argparse.ArgumentParser, handler: Handler) -> None:
    add_target_options(parser)
    parser.set_defaults(func=_guarded(handler))


def _guarded(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (ClusterError, LogUnavailable) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return run


def target_of(args: argparse.Namespace) -> Target:
    return connect(args.kubeconfig, args.context, args.namespace)


# --- submit ---------------------------------------------------------------------------------------------------


def run_submit(args: argparse.Namespace) -> int:
    from kuberl.api.documents import check, is_other_kind, load_documents
    from kuberl.api.overrides import apply_overrides
    from kuberl.api.validation import invalid_text

    try:
        documents = [
            (source, doc if is_other_kind(doc) or not args.set else apply_overrides(doc, args.set))
            for source, doc in load_documents(args.file)
        ]
    except (OSError, ValueError) as exc:
        raise ClusterError(str(exc)) from exc
    rljobs = []
    for source, doc in documents:
        checked = check(source, doc)
        if checked.skipped_kind is None and not checked.valid:
            print(invalid_text(source, checked.name, checked.issues), file=sys.stderr)
            return 1
        if checked.skipped_kind is None:
            rljobs.append(checked.name)
    if not rljobs:
        raise ClusterError(f"{args.file} holds no RLJob")
    target = target_of(args)
    for _, doc in documents:
        print(apply(target, doc, force_conflicts=args.force_conflicts))
    if not args.follow:
        return 0
    return follow(target, rljobs[0], sys.stdout)


def apply(target: Target, doc: dict[str, Any], *, force_conflicts: bool = False, dry_run: bool = False) -> str:
    """Server-side apply of one object (its namespace, else the target's); `kind.group/name applied` as kubectl."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    kind, name = doc.get("kind", "?"), doc.get("metadata", {}).get("name", "?")
    try:
        resource = DynamicClient(target.api).resources.get(api_version=doc["apiVersion"], kind=kind)
    except ResourceNotFoundError as exc:
        hint = " (install the chart first: its CRD)" if kind == "RLJob" else ""
        raise ClusterError(f"the cluster does not serve {doc['apiVersion']} {kind}{hint}") from exc
    except Exception as exc:
        raise api_error(exc, f"reaching {target.api.configuration.host}") from exc
    namespace = doc.get("metadata", {}).get("namespace") or target.namespace if resource.namespaced else None
    options: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    try:
        resource.server_side_apply(
            body=doc, namespace=namespace, field_manager=FIELD_MANAGER, force_conflicts=force_conflicts, **options
        )
    except ApiException as exc:
        raise api_error(exc, f"applying {kind} {name}") from exc
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    where = f" in namespace {namespace}" if namespace else ""
    return f"{kind.lower()}{'.' + group if group else ''}/{name} {'applied (dry run)' if dry_run else 'applied'}{where}"


def follow(target: Target, name: str, out: TextIO, *, period: float = FOLLOW_PERIOD_SECONDS) -> int:
    """Print a progress line at each change until the RLJob ends: 0 Succeeded, 1 Failed."""
    last = ""
    while True:
        rljob = get_rljob(target, name)
        line = progress_line(rljob)
        if line != last:
            print(f"{_clock()}  {name}  {line}", file=out, flush=True)
            last = line
        if is_terminal(rljob):
            return 0 if phase_of(rljob) == Phase.SUCCEEDED.value else 1
        time.sleep(period)


def _clock() -> str:
    return datetime.now(UTC).astimezone().strftime("%H:%M:%S")


# --- status ---------------------------------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    target = target_of(args)
    if args.watch:
        return follow(target, args.name, sys.stdout)
    rljob = get_rljob(target, args.name)
    pods = list_pods(target, args.name)
    if args.output == "json":
        print(json.dumps({"name": args.name, "status": rljob.get("status") or {}, "pods": pods}, indent=2))
    else:
        print(status_text(rljob, pods, datetime.now(UTC)))
    return 0


def list_pods(target: Target, name: str) -> list[dict[str, Any]]:
    """The RLJob's pods (its label), as plain dicts."""
    from kubernetes import client

    try:
        items = client.CoreV1Api(target.api).list_namespaced_pod(
            target.namespace, label_selector=f"{RLJOB_LABEL}={name}"
        )
    except Exception as exc:
        raise api_error(exc, f"listing the pods of RLJob {name}") from exc
    pods: list[dict[str, Any]] = target.api.sanitize_for_serialization(items.items)
    return [p for p in pods if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "log-reader"]


# --- stop / resume --------------------------------------------------------------------------------------------


def run_stop(args: argparse.Namespace) -> int:
    return _suspend(args, suspend=True)


def run_resume(args: argparse.Namespace) -> int:
    return _suspend(args, suspend=False)


def _suspend(args: argparse.Namespace, *, suspend: bool) -> int:
    target = target_of(args)
    rljob = get_rljob(target, args.name)
    if is_terminal(rljob):
        raise ClusterError(
            f"RLJob {args.name} is {phase_of(rljob)}: it cannot be {'stopped' if suspend else 'resumed'}"
        )
    patch_rljob(target, args.name, {"spec": {"runPolicy": {"suspend": suspend}}})
    verb = "stopping" if suspend else "resuming"
    print(f"rljob.{GROUP}/{args.name} {verb}: spec.runPolicy.suspend={str(suspend).lower()}")
    if args.no_wait:
        return 0
    wanted = "the Suspended phase" if suspend else "a phase other than Suspended"
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        rljob = get_rljob(target, args.name)
        phase = phase_of(rljob)
        if (phase == Phase.SUSPENDED.value) == suspend or is_terminal(rljob):
            break
        time.sleep(FOLLOW_PERIOD_SECONDS)
    else:
        raise ClusterError(
            f"RLJob {args.name} did not reach {wanted} in {args.timeout:.0f} s: kuberl status {args.name}"
        )
    progress = (rljob.get("status") or {}).get("progress") or {}
    checkpoint = progress.get("lastCheckpoint")
    print(f"{args.name}: {progress_line(rljob)}")
    if suspend:
        print(f"last checkpoint: {checkpoint or 'none yet'}; `kuberl resume {args.name}` continues from it")
    return 0


# --- logs -----------------------------------------------------------------------------------------------------


def run_logs(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    target = target_of(args)
    rljob = get_rljob(target, args.name)
    rayjob_name = (rljob.get("status") or {}).get("rayJobName")
    if not rayjob_name:
        raise LogUnavailable(
            f"RLJob {args.name} has no RayJob yet ({phase_of(rljob)}): its trainer has not started; "
            f"`kuberl status {args.name}` says why"
        )
    core: Any = client.CoreV1Api(target.api)  # its stubs type pods as V1Pod; a dict body is what the API takes
    try:
        rayjob: Any = client.CustomObjectsApi(target.api).get_namespaced_custom_object(
            RAY_GROUP, RAY_VERSION, target.namespace, RAYJOB_PLURAL, rayjob_name
        )
        template = head_template(rayjob)
        configmap = core.read_namespaced_config_map(spec_configmap(template), target.namespace)
        pod = reader_pod(
            rljob, template, log_path((configmap.data or {})[SPEC_FILE]), follow=args.follow, tail=args.tail
        )
        core.create_namespaced_pod(target.namespace, pod)
    except ApiException as exc:
        raise api_error(exc, f"preparing to read the log of RLJob {args.name}") from exc
    name = pod["metadata"]["name"]
    stop = threading.Event()
    try:
        _wait_started(core, target.namespace, name, args.timeout)
        if args.follow:
            threading.Thread(target=_end_with_job, args=(target, args.name, core, name, stop), daemon=True).start()
        # followed also without --follow: the reader's `tail` exits after the file, and its exit ends the stream
        stream = core.read_namespaced_pod_log(
            name, target.namespace, container="log", follow=True, _preload_content=False
        )
        try:
            for chunk in stream.stream(amt=4096):
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        except Exception:
            if not stop.is_set():  # the reader pod was not stopped by us: the connection failed
                raise
        if not args.follow:
            return _reader_result(core, target.namespace, name)
    except ApiException as exc:
        raise api_error(exc, f"reading the log of RLJob {args.name}") from exc
    finally:
        stop.set()
        _delete_pod(core, target.namespace, name)
    return 0


def _reader_result(core: Any, namespace: str, name: str) -> int:
    """0 when the reader printed the log; 1, with the reason, when there was none to print (its exit code, which
    the kubelet reports within moments of the log's end)."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        for status in pod.status.container_statuses or []:
            if status.state and status.state.terminated:
                if status.state.terminated.exit_code == 0:
                    return 0
                print(
                    "error: no driver log yet: the trainer starts writing it when the driver starts "
                    f"(`kuberl status {pod.metadata.labels[RLJOB_LABEL]}`)",
                    file=sys.stderr,
                )
                return 1
        if pod.status.phase in ("Succeeded", "Failed"):
            return 0 if pod.status.phase == "Succeeded" else 1
        time.sleep(0.5)
    return 0


def _wait_started(core: Any, namespace: str, name: str, timeout: float) -> None:
    """Until the reader pod runs (or has run); its scheduling or image problem as the error otherwise."""
    deadline = time.monotonic() + timeout
    why = "it is Pending"
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in ("Running", "Succeeded", "Failed"):
            return
        for condition in pod.status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                why = f"{condition.reason}: {condition.message}"
        for status in pod.status.container_statuses or []:
            if status.state and status.state.waiting and status.state.waiting.reason not in (None, "ContainerCreating"):
                why = f"{status.state.waiting.reason}: {status.state.waiting.message or ''}".rstrip(": ")
        time.sleep(1)
    raise LogUnavailable(f"the log reader pod {name} did not start in {timeout:.0f} s ({why})")


def _end_with_job(target: Target, rljob: str, core: Any, pod: str, stop: threading.Event) -> None:
    """--follow: once the RLJob has ended, let the reader print what the trainer wrote last, then stop it."""
    while not stop.wait(FOLLOW_PERIOD_SECONDS * 2.5):
        try:
            if is_terminal(get_rljob(target, rljob)):
                stop.wait(FOLLOW_PERIOD_SECONDS * 1.5)
                _delete_pod(core, target.namespace, pod)
                return
        except ClusterError:
            continue


def _delete_pod(core: Any, namespace: str, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            print(f"warning: could not delete the log reader pod {name}: {exc.reason}", file=sys.stderr)


# --- crd --apply ----------------------------------------------------------------------------------------------


def apply_crd(args: argparse.Namespace) -> int:
    """The CRD this kuberl generates, server-side applied (Helm installs crds/ once and never upgrades them)."""
    from kuberl.api.crd import render_crd

    try:
        line = apply(target_of(args), render_crd(), force_conflicts=True, dry_run=args.dry_run)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(line)
    return 0
