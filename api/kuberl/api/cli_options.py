"""The output options every `kuberl` subcommand spells the same way, as kubectl does.

`-o/--output FORMAT` chooses a report format (text or json); `--output-file PATH` names where a generated file
goes ('-' for stdout where the output is text); a folder a command creates is a positional argument
(`kuberl export SOURCE OUT`). Spellings from before this convention are accepted but not shown in the help.
"""

from __future__ import annotations

import argparse

FORMATS = ("text", "json")


def add_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=FORMATS, default="text", help="report format (default text)")


def add_output_file_option(
    parser: argparse.ArgumentParser,
    help: str,
    *,
    default: str | None = None,
    required: bool = False,
    legacy: tuple[str, ...] = (),
) -> None:
    """`--output-file PATH` (dest ``output_file``), plus hidden ``legacy`` spellings of the same option."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--output-file", metavar="PATH", default=default, help=help)
    if legacy:
        group.add_argument(*legacy, dest="output_file", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
