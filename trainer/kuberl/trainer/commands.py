"""The trainer's ``kuberl`` subcommands: run, export, plot, data, stats.

Imported by ``kuberl.cli`` on every invocation, so nothing heavy (torch, ray, transformers) is imported at module
level; each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from kuberl.api.cli_options import add_format_option, add_output_file_option
from kuberl.api.memory import GPU_LABELS
from kuberl.api.overrides import add_set_argument
from kuberl.api.spec import RLJobSpec

Handler = Callable[[argparse.Namespace], int]

DATA_TASKS = ("gsm8k-synth", "digits", "arithmetic", "code-synth")
EXPORT_DTYPES = ("bfloat16", "float16", "float32")


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], make_handler: Callable[[str], Handler]
) -> None:
    run_p = sub.add_parser("run", help="train an RLJob on an embedded local Ray (or --address), no Kubernetes")
    run_p.add_argument("file", help="RLJob YAML (one document)")
    run_p.add_argument("--address", help="join this Ray cluster (ray start / Slurm) instead of starting one")
    run_p.add_argument("--run-dir", help="metrics, plots and logs (default runs/<rljob name>/)")
    run_p.add_argument("--steps", type=int, help="override trainer.totalSteps")
    run_p.add_argument(
        "--sandbox",
        action="append",
        default=[],
        metavar="POOL=ADDRESS",
        help="run the programs of sandbox pool POOL (reward, tools) at ADDRESS (http://HOST:PORT or unix:PATH, a "
        "`python -m kuberl.sandbox serve`) instead of a local server started for the run",
    )
    add_set_argument(run_p)
    run_p.add_argument("--no-progress", action="store_true", help="no progress bar (summary lines only)")
    run_p.set_defaults(func=make_handler("run"))

    plan_p = sub.add_parser(
        "plan",
        help="per-GPU memory of each role and phase before launch: does it fit, the largest micro-batch that does",
        description="Reads the model's shape (model.shape, else tiny://, GGUF, config.json) without loading weights. "
        "The GPU comes "
        f"from the pool's node selector ({', '.join(GPU_LABELS)}, or an instance type of one GPU model) or --gpu.",
    )
    plan_p.add_argument("file", help="RLJob YAML (one document)")
    plan_p.add_argument("--gpu", help="GPU model (H200, H100-80GB, A100-40GB, ...) or memory size (80GiB)")
    plan_p.add_argument(
        "--gpus",
        type=int,
        help="GPUs of the machine or Ray cluster the job runs on (kuberl run: this machine's); with placement "
        "separate, fewer than trainer + rollout ask puts the engines on the trainer's GPUs (the shared layout). "
        "Default: a cluster with the node pools the RLJob asks for",
    )
    plan_p.add_argument(
        "--model",
        metavar="SOURCE",
        help="read the model's shape here instead of model.shape or model.path, which may exist only in the pods: a "
        "local copy of its folder or config.json, hf://ORG/NAME, a .gguf file",
    )
    add_format_option(plan_p)
    add_set_argument(plan_p)
    plan_p.set_defaults(func=make_handler("plan"))

    export_p = sub.add_parser(
        "export",
        help="write a checkpoint's policy as a Hugging Face folder (save_pretrained: sharded safetensors, index)",
    )
    export_p.add_argument(
        "checkpoint",
        help="a global_step_N folder, a trainer.checkpointDir or a `kuberl run` folder (its latest checkpoint)",
    )
    export_p.add_argument("out", help="the folder to create")
    export_p.add_argument("--dtype", choices=EXPORT_DTYPES, default="bfloat16", help="weights dtype (default bfloat16)")
    export_p.add_argument(
        "--max-shard-size", default="5GB", help="largest safetensors shard, as save_pretrained reads it (default 5GB)"
    )
    export_p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    export_p.set_defaults(func=make_handler("export"))

    plot_p = sub.add_parser(
        "plot", help="plot reward, KL to the reference, entropy, response length, step time and throughput of a run"
    )
    plot_p.add_argument("run_dir", help="a `kuberl run` folder holding metrics.jsonl")
    add_output_file_option(plot_p, "PNG path (default RUN_DIR/metrics.png)", legacy=("--output",))
    plot_p.set_defaults(func=make_handler("plot"))

    data_p = sub.add_parser("data", help="generate a dataset in verl's schema")
    data_p.add_argument(
        "task",
        choices=DATA_TASKS,
        help="gsm8k-synth: GSM8K-like word problems; digits: tiny models; arithmetic: calculator tool (rollout.agent); "
        "code-synth: programming tasks with tests (reward code_tests)",
    )
    add_output_file_option(data_p, "the file to write: .parquet or .jsonl", required=True, legacy=("--out",))
    data_p.add_argument("--n", type=int, default=1000, help="rows (default 1000)")
    data_p.add_argument("--seed", type=int, default=0, help="random seed; with the split it fixes the rows (default 0)")
    data_p.add_argument(
        "--split", default="train", help="split name, recorded in extra_info and seeding (default train)"
    )
    data_p.add_argument("--max-operand", type=int, help="gsm8k-synth: largest starting amount and addend (default 50)")
    data_p.add_argument(
        "--steps",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="gsm8k-synth: arithmetic steps per problem, inclusive range (default 1 3)",
    )
    data_p.add_argument(
        "--layout",
        choices=("chat", "short"),
        help="arithmetic: chat (the question in words, the hermes call shown; default) or short (the bare "
        "expression, a JSON call: what a tiny model learns)",
    )
    data_p.set_defaults(func=make_handler("data"))

    stats_p = sub.add_parser("stats", help="token-length percentiles of a dataset and suggested length limits")
    stats_p.add_argument("files", nargs="+", help="parquet / jsonl / json files, local, s3:// or hf://datasets/")
    stats_p.add_argument("--tokenizer", required=True, help="model path (as in model.path) whose tokenizer counts")
    stats_p.add_argument("--prompt-key", default="prompt", help="column holding the chat prompt (default prompt)")
    stats_p.set_defaults(func=make_handler("stats"))


def print_invalid(exc: Exception, source: str, name: str) -> None:
    """The same text as ``kuberl validate`` for an invalid RLJob."""
    from kuberl.api.validation import invalid_text

    print(invalid_text(source, name, getattr(exc, "issues", [])), file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from kuberl.api import InvalidSpec, load_rljob

    try:
        name, spec = load_rljob(args.file, args.set, one_machine=True)
    except InvalidSpec as exc:
        print_invalid(exc, args.file, rljob_name(args.file))
        return 1
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        sandboxes = sandbox_addresses(args.sandbox, spec)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from kuberl.trainer.driver.failures import PERMANENT_ERRORS
    from kuberl.trainer.run import run_job

    try:
        return run_job(
            name,
            spec,
            address=args.address,
            run_dir=args.run_dir,
            steps=args.steps,
            show_progress=not args.no_progress,
            sandboxes=sandboxes,
        )
    except PERMANENT_ERRORS as exc:  # a retry cannot fix it: the message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1


def sandbox_addresses(entries: list[str], spec: RLJobSpec) -> dict[str, str]:
    """``--sandbox POOL=ADDRESS`` entries by pool; ValueError for a malformed one or a pool the RLJob lacks."""
    addresses = {}
    for entry in entries:
        pool, _, address = entry.partition("=")
        if not address:
            raise ValueError(f"--sandbox {entry}: write POOL=ADDRESS, e.g. reward=http://127.0.0.1:8000")
        if pool not in spec.sandbox_pools:
            raise ValueError(
                f"--sandbox {entry}: the RLJob has no {pool!r} sandbox pool; its pools: "
                f"{', '.join(spec.sandbox_pools) or 'none'} (reward.sandbox is reward, rollout.agent.sandbox is tools)"
            )
        addresses[pool] = address
    return addresses


def plan(args: argparse.Namespace) -> int:
    import json

    from kuberl.api import InvalidSpec, load_rljob, plan_batches
    from kuberl.api.memory import declared_shape, format_plan, gpu_named, gpu_of, plan_memory
    from kuberl.api.memory_admission import PLAN_FITS_RULE
    from kuberl.trainer.model.loading import ModelNotFoundError
    from kuberl.trainer.model.shape import model_shape
    from kuberl.trainer.plan.layout import ClusterFacts, PlacementError, plan_rollout_layout

    try:
        name, spec = load_rljob(args.file, args.set, ignore=frozenset({PLAN_FITS_RULE}))
    except InvalidSpec as exc:
        print_invalid(exc, args.file, rljob_name(args.file))
        return 1
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if spec.cluster.device == "cpu":
        print(f"error: {args.file}: cluster.device is cpu; the memory plan is for GPU jobs", file=sys.stderr)
        return 2
    try:
        gpu = gpu_named(args.gpu) if args.gpu else gpu_of(spec)
        rollout_gpu = gpu_named(args.gpu) if args.gpu else gpu_of(spec, "rollout")
        shape = model_shape(args.model) if args.model else declared_shape(spec) or model_shape(spec.model.path)
        layout = (
            None if args.gpus is None else plan_rollout_layout(spec, plan_batches(spec), ClusterFacts(gpus=args.gpus))
        )
    except PlacementError as exc:
        print(f"error: {args.file}: {exc}", file=sys.stderr)
        return 1
    except (ModelNotFoundError, ValueError, KeyError) as exc:
        print(f"error: {exc}{pod_only_hint(spec) if not args.model else ''}", file=sys.stderr)
        return 2
    if gpu is None:
        print(
            f"error: {args.file} names no GPU (node selector {' or '.join(GPU_LABELS)}, or an instance type); pass "
            "--gpu, e.g. --gpu H100-80GB",
            file=sys.stderr,
        )
        return 2
    result = plan_memory(spec, shape, gpu, rollout_gpu, layout=layout.kind if layout else None)
    if args.output == "json":
        print(json.dumps({"name": name, **result.as_dict()}, indent=2))
    else:
        print(format_plan(name, result))
    return 0 if result.fits else 1


def pod_only_hint(spec: RLJobSpec) -> str:
    """For a model.path on a volume the pods mount: it is not here, and --model gives its shape instead."""
    path = spec.model.path
    mount = next((m for m in spec.cluster.volume_mounts if path.startswith(m.mount_path.rstrip("/") + "/")), None)
    if mount is None:
        return ""
    return (
        f"\nmodel.path {path} is on the volume {mount.name} of the pods, not on this machine: read the model's "
        f"shape elsewhere with --model, e.g. --model hf://ORG/{path.rstrip('/').rsplit('/', 1)[-1]} or a local "
        "folder holding its config.json, or declare it in model.shape (admission then plans with it too)"
    )


def rljob_name(path: str) -> str:
    try:
        import yaml

        doc = yaml.safe_load(Path(path).read_text())
        return str(doc.get("metadata", {}).get("name", "?"))
    except Exception:
        return "?"


def export(args: argparse.Namespace) -> int:
    from kuberl.trainer.checkpoint.export import ExportError, export_checkpoint, find_checkpoint, run_record

    try:
        checkpoint = find_checkpoint(args.checkpoint)
        spec = run_record(Path(args.checkpoint)).get("spec")
        out = export_checkpoint(
            checkpoint, args.out, dtype=args.dtype, max_shard_size=args.max_shard_size, force=args.force, spec=spec
        )
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError, RuntimeError) as exc:  # unreadable checkpoint, bad shard size, disk full
        print(f"error: cannot export {args.checkpoint}: {exc}", file=sys.stderr)
        return 1
    print(f"exported {checkpoint} to {out} ({args.dtype})")
    return 0


def plot(args: argparse.Namespace) -> int:
    from kuberl.trainer.observe.plot import plot_run

    try:
        out = plot_run(args.run_dir, args.output_file)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def data(args: argparse.Namespace) -> int:
    from kuberl.trainer.data import tasks

    if args.layout is not None and args.task != "arithmetic":
        print(f"error: --layout shapes arithmetic problems; the {args.task} task takes none", file=sys.stderr)
        return 1
    if args.task == "gsm8k-synth":
        shape = {}  # only what was given, so the defaults stay gsm8k_synth's
        if args.max_operand is not None:
            shape["max_operand"] = args.max_operand
        if args.steps is not None:
            shape["steps"] = tuple(args.steps)
        try:
            tasks.main_gsm8k_synth(args.output_file, args.n, args.seed, args.split, **shape)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    elif args.max_operand is not None or args.steps is not None:
        print(
            f"error: --max-operand and --steps shape gsm8k-synth problems; the {args.task} task takes neither",
            file=sys.stderr,
        )
        return 1
    elif args.task == "arithmetic":
        tasks.main_arithmetic(args.output_file, args.n, args.seed, args.split, args.layout or "chat")
    elif args.task == "code-synth":
        from kuberl.trainer.data.code_synth import main_code_synth

        try:
            main_code_synth(args.output_file, args.n, args.seed, args.split)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    else:
        try:
            tasks.main_digit_copy(args.output_file, args.n, args.seed, args.split)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


def stats(args: argparse.Namespace) -> int:
    from kuberl.trainer.data.lengths import format_report, length_stats
    from kuberl.trainer.data.prompts import DataError
    from kuberl.trainer.model.loading import load_tokenizer

    try:
        report = length_stats(args.files, load_tokenizer(args.tokenizer), args.prompt_key)
    except (DataError, OSError, ValueError, KeyError) as exc:  # a missing file or model: a message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 0
