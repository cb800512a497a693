"""`python -m kuberl.sandbox serve|probe`: the sandbox pod's server (kuberl.api.contract.sandbox_command renders its
arguments), and what this machine lets a sandbox enforce."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from kuberl.api.spec import SandboxExecution
from kuberl.sandbox import isolation, linux, server
from kuberl.sandbox.executor import Executor
from kuberl.sandbox.settings import limits_of


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kuberl.sandbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve executions over HTTP")
    serve.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT, or unix:PATH")
    serve.add_argument("--executions", type=int, default=2, help="executions at once (the spec's executionsPerPod)")
    serve.add_argument("--limits", default="{}", help="the spec's sandbox.execution as JSON (camelCase)")
    serve.add_argument("--workroot", default=None, help="where the executions' directories go (default: TMPDIR)")
    serve.add_argument(
        "--parent",
        type=int,
        default=None,
        help="the pid of the process that started this server (kuberl run): stop when it ends, even by SIGKILL",
    )
    for command in (serve, commands.add_parser("probe", help="print what this machine lets a sandbox enforce")):
        command.add_argument(
            "--isolation",
            choices=["auto", "namespaces", "process"],
            default="auto",
            help="auto: namespaces where the machine allows them, else process isolation behind an enforced "
            "NetworkPolicy; either is verified at start, and the server refuses to start without one",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "parent", None) is not None:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGTERM)  # stop() on the parent's end
        if os.getppid() != args.parent:  # it ended before the line above
            return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limits = limits_of(SandboxExecution.model_validate_json(getattr(args, "limits", "{}")))
    try:
        chosen = isolation.decide(args.isolation, limits)
    except isolation.SandboxUnavailable as exc:
        print(f"kuberl sandbox: {exc}", file=sys.stderr)
        return 1
    if args.command == "probe":
        print(chosen.report())
        return 0
    server.serve(args.listen, Executor(limits, args.executions, chosen.mode, args.workroot), chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
