"""The `kuberl` command line: offline admission, CRD and docs generation, and the trainer's commands.

The API commands import nothing heavy; trainer commands load `kuberl.trainer` only when called.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kuberl.api.cli_options import add_format_option, add_output_file_option
from kuberl.api.documents import Checked, check, load_documents, manifest_files
from kuberl.api.overrides import add_set_argument
from kuberl.api.policy import Policy
from kuberl.api.validation import invalid_text, plural
from kuberl.cluster.commands import add_commands as add_cluster_commands
from kuberl.cluster.commands import add_target_options

CRD_PATHS = (Path("crds/rljob.yaml"), Path("charts/kuberl/crds/rljob.yaml"))
"""The CRD and the Helm chart's copy of it, written together so they never differ."""
DOCS_PATH = Path("docs/api.md")
CHECKOUT_MARKER = Path("charts/kuberl/Chart.yaml")
"""What makes the working folder a kuberl checkout, where `kuberl crd` and `kuberl docs` write by default."""


def _validate(args: argparse.Namespace) -> int:
    from kuberl.api.documents import is_other_kind
    from kuberl.api.overrides import apply_overrides

    policy = _policy(args)
    if policy is None:
        return 2
    results: list[Checked] = []
    for path in args.files:
        try:
            for source, doc in (d for f in manifest_files(path) for d in load_documents(f)):
                rljob = doc if is_other_kind(doc) or not args.set else apply_overrides(doc, args.set)
                results.append(check(source, rljob, policy))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.output == "json":
        print(json.dumps([_as_json(r) for r in results], indent=2))
    else:
        for result in results:
            print(_as_text(result))
    checked = [r for r in results if r.skipped_kind is None]
    if not checked:
        print("error: no RLJob document in " + ", ".join(args.files), file=sys.stderr)
        return 2
    return 0 if all(r.valid for r in checked) else 1


def _policy(args: argparse.Namespace) -> Policy | None:
    """The trust policy `kuberl validate` applies: the chart's defaults, a values file, or the installed
    operator's; None (after printing why) when it cannot be read."""
    from kuberl.api import yaml12
    from kuberl.api.policy import PolicyNotFound, policy_from_cluster, policy_from_values

    if args.policy:
        try:
            values = yaml12.load(Path(args.policy).read_text()) or {}
        except OSError as exc:
            print(f"error: --policy {args.policy}: cannot read: {exc.strerror}", file=sys.stderr)
            return None
        if not isinstance(values, dict):
            print(f"error: --policy {args.policy}: expected the chart's values (a mapping)", file=sys.stderr)
            return None
        return policy_from_values(values)
    if args.cluster:
        try:
            policy, deployment = policy_from_cluster(args.operator_namespace)
        except PolicyNotFound as exc:
            print(f"error: --cluster: {exc}", file=sys.stderr)
            return None
        print(f"policy: the operator's, Deployment {deployment}", file=sys.stderr)
        return policy
    return Policy()


def _as_json(result: Checked) -> dict[str, Any]:
    if result.skipped_kind is not None:
        return {"source": result.source, "name": result.name, "skipped": result.skipped_kind}
    return {
        "source": result.source,
        "name": result.name,
        "valid": result.valid,
        "issues": [{"field": i.field, "message": i.message, "rule": i.rule} for i in result.issues],
        "derived": result.plan.as_dict() if result.plan else None,
    }


def _as_text(result: Checked) -> str:
    if result.skipped_kind is not None:
        return f"{result.source}: {result.skipped_kind} {result.name} skipped (not an RLJob)"
    if not result.valid:
        return invalid_text(result.source, result.name, result.issues)
    assert result.plan is not None
    p = result.plan
    unit = "GPU" if result.device == "cuda" else "rank"
    accumulation = p.gradient_accumulation_steps if p.gradient_accumulation_steps else "by token budget"
    mini_batches = plural(p.mini_batches_per_step, "mini-batch", "mini-batches")
    trainers = "trainer GPUs (data-parallel ranks)" if result.device == "cuda" else "trainer ranks (CPU processes)"
    rows = [
        (trainers, p.trainer_gpus),
        (f"rollout {unit}s / engines", f"{p.rollout_gpus} / {p.rollout_engines}"),
        ("responses per step", p.responses_per_step),
        ("optimizer steps per step", f"{p.optimizer_steps_per_step} ({mini_batches} × ppoEpochs)"),
        ("responses per mini-batch", p.responses_per_mini_batch),
        (f"rows per {unit} per step", p.rows_per_gpu_per_step),
        (f"rows per {unit} per mini-batch", p.rows_per_gpu_per_mini_batch),
        (f"micro-batch per {unit}", p.micro_batch_size_per_gpu or "dynamic"),
        ("gradient-accumulation steps", accumulation),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{result.source}: RLJob {result.name} is valid"] + [f"  {k:<{width}}  {v}" for k, v in rows])


def _write_or_check(paths: list[Path], content: str, check_only: bool, command: str) -> int:
    if paths == [Path("-")]:
        if check_only:
            print("error: --check compares files; it cannot check '-' (stdout)", file=sys.stderr)
            return 2
        sys.stdout.write(content)
        return 0
    if check_only:
        missing = [p for p in paths if not p.exists()]
        stale = [p for p in paths if p.exists() and p.read_text() != content]
        for path in missing:
            print(
                f"{path.resolve()} does not exist: run `kuberl {command}` in the repository root, "
                "or name the file with --output-file",
                file=sys.stderr,
            )
        for path in stale:
            print(f"{path} is stale: run `kuberl {command}`", file=sys.stderr)
        if not missing and not stale:
            print("up to date: " + ", ".join(map(str, paths)), file=sys.stderr)
        return 1 if missing or stale else 0
    for path in paths:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        except OSError as exc:
            print(f"error: cannot write {path}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"wrote {path}")
    return 0


def _outside_checkout(command: str, paths: list[Path]) -> bool:
    """True (with the message) when writing the default `paths` would create them in a folder that is no checkout."""
    if CHECKOUT_MARKER.is_file():
        return False
    print(
        f"error: `kuberl {command}` writes {', '.join(map(str, paths))} of a kuberl checkout, and {Path.cwd()} is "
        "not one (no charts/kuberl/Chart.yaml): run it in the repository root, or name a file with --output-file "
        "PATH ('-' for stdout)",
        file=sys.stderr,
    )
    return True


def _crd(args: argparse.Namespace) -> int:
    from kuberl.api.crd import crd_yaml

    if args.apply:
        from kuberl.cluster.commands import apply_crd

        return apply_crd(args)
    paths = [Path(args.output_file)] if args.output_file else list(CRD_PATHS)
    if not args.output_file and not args.check and _outside_checkout("crd", paths):
        return 2
    return _write_or_check(paths, crd_yaml(), args.check, "crd")


def _docs(args: argparse.Namespace) -> int:
    from kuberl.api.docs import api_markdown

    if args.output_file == str(DOCS_PATH) and not args.check and _outside_checkout("docs", [DOCS_PATH]):
        return 2
    return _write_or_check([Path(args.output_file)], api_markdown(), args.check, "docs")


def _import_verl(args: argparse.Namespace) -> int:
    from kuberl.api import yaml12
    from kuberl.api.verl import VerlInputError, VerlRefused, shown, to_rljob
    from kuberl.api.verl_import import read_run

    try:
        env = dict(_key_value(item, "--env") for item in args.env)
        run = read_run(args.inputs, env=env, verl_config=args.verl_config, read_stdin=sys.stdin.read)
        imported = to_rljob(run.values, args.name, lossy=args.lossy, explicit=run.explicit)
    except VerlRefused as exc:
        for key, value, reason in exc.refusals:
            print(f"error: {key}={shown(value)}: {reason}; kuberl cannot run it (--lossy drops it)", file=sys.stderr)
        return 2
    except VerlInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    document = imported.document
    text = json.dumps(document, indent=2) + "\n" if args.output == "json" else yaml12.dump(document)
    if args.output_file == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.output_file).write_text(text)
        except OSError as exc:
            print(f"error: cannot write {args.output_file}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"wrote {args.output_file}", file=sys.stderr)
    for key, value, reason in imported.unmapped:
        print(f"not imported: {key}={shown(value)}: {reason}", file=sys.stderr)
    for key, value, reason in imported.dropped:
        print(f"dropped (--lossy): {key}={shown(value)}: {reason}", file=sys.stderr)
    for note in [*run.notes, *imported.notes]:
        print(f"note: {note}", file=sys.stderr)
    result = check(args.output_file if args.output_file != "-" else "<import>", document)
    if not result.valid:
        print(_as_text(result), file=sys.stderr)
        return 1
    return 0


def _key_value(item: str, option: str) -> tuple[str, str]:
    from kuberl.api.verl import VerlInputError

    key, sep, value = item.partition("=")
    if not sep or not key:
        raise VerlInputError(f"{option} {item!r}: expected KEY=VALUE, e.g. {option} HOME=/data")
    return key, value


def _trainer_command(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            from kuberl.trainer import commands
        except ImportError as exc:
            print(f"error: `kuberl {name}` needs the trainer: pip install 'kuberl[trainer]' ({exc})", file=sys.stderr)
            return 2
        command: Callable[[argparse.Namespace], int] = getattr(commands, name.replace("-", "_"))
        return command(args)

    return run


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kuberl")
    except PackageNotFoundError:
        return "unknown (not installed as a package)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser(
        "validate", help="check RLJob manifests offline with the admission rules and the operator's trust policy"
    )
    validate.add_argument(
        "files", nargs="+", help="YAML files (multi-document allowed), folders of them, or '-' for stdin"
    )
    add_format_option(validate)
    add_set_argument(validate)
    source = validate.add_mutually_exclusive_group()
    source.add_argument(
        "--policy",
        metavar="VALUES",
        help="the chart's values file the operator is installed with (its security.* and trainer.serviceAccount); "
        "default: the chart's defaults",
    )
    source.add_argument(
        "--cluster",
        action="store_true",
        help="the policy of the operator installed in the kubeconfig's cluster, read from its Deployment",
    )
    validate.add_argument("--operator-namespace", help="with --cluster: where the operator runs (default: search all)")
    validate.set_defaults(func=_validate)

    import_verl = sub.add_parser(
        "import-verl",
        help="turn a verl run (a launch script, a verl YAML, or key=value overrides) into an RLJob",
        description="Expands a launch script as bash would, composes the config it names with verl's own config "
        "files (an installed verl, or --verl-config), and maps verl's keys through the table in docs/api.md. Keys "
        "with no RLJob equivalent are listed with the reason; keys whose values kuberl cannot run (Megatron, "
        "tensor/pipeline/sequence parallelism, SGLang) are refused, or dropped with --lossy. The RLJob is "
        "validated: exit 1 when it needs edits, 2 when nothing was written.",
    )
    import_verl.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="a verl launch script or YAML file ('-' for stdin), or key=value overrides applied in order",
    )
    add_output_file_option(import_verl, "where the RLJob goes (default '-': stdout)", default="-")
    import_verl.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="format of the RLJob (default yaml)"
    )
    import_verl.add_argument("--name", help="metadata.name (default: trainer.experiment_name, else verl-import)")
    import_verl.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable the script reads from its environment, or one whose value it computes with a command "
        "kuberl does not run ($(pwd), $(date)); 1=VALUE is the script's first argument (repeatable)",
    )
    import_verl.add_argument(
        "--lossy",
        action="store_true",
        help="import what kuberl cannot run as verl would (Megatron, TP/PP, Ulysses, SGLang) without it, listing "
        "every key dropped",
    )
    import_verl.add_argument(
        "--verl-config",
        metavar="DIR",
        help="verl's verl/trainer/config folder (default: the installed verl's), for its Hydra defaults",
    )
    import_verl.set_defaults(func=_import_verl)

    crd = sub.add_parser("crd", help="write the RLJob CRD generated from the spec models and rules")
    add_output_file_option(
        crd, "one file ('-' = stdout) instead of crds/ and the chart's crds/", legacy=("--output", "-o")
    )
    crd.add_argument("--check", action="store_true", help="exit 1 if the file is stale instead of writing it")
    crd.add_argument(
        "--apply",
        action="store_true",
        help="server-side apply the CRD to the cluster (before `helm upgrade`: Helm never upgrades crds/)",
    )
    crd.add_argument("--dry-run", action="store_true", help="with --apply: the apiserver checks it, nothing changes")
    add_target_options(crd)
    crd.set_defaults(func=_crd)

    docs = sub.add_parser("docs", help="write docs/api.md generated from the spec models and rules")
    add_output_file_option(
        docs,
        f"where the Markdown goes ('-' = stdout; default {DOCS_PATH})",
        default=str(DOCS_PATH),
        legacy=("--output", "-o"),
    )
    docs.add_argument("--check", action="store_true", help="exit 1 if the file is stale instead of writing it")
    docs.set_defaults(func=_docs)

    add_cluster_commands(sub)
    try:
        from kuberl.trainer.commands import add_commands
    except ImportError:  # the API-only install: no trainer commands
        return parser
    add_commands(sub, _trainer_command)
    return parser


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `cat` exits with when the reader of its output went away


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        inputs = getattr(args, "inputs", None)
        if not isinstance(inputs, list) or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        inputs += extra  # import-verl: key=value overrides written after the options
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except BrokenPipeError:  # `kuberl ... | head -1`: stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
