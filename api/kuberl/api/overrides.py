"""`--set path=value`: dot-list overrides of an RLJob document, in wire (camelCase) names.

A path starts below `spec` (`batch.trainBatchSize=32`); `spec.`, `metadata.` and `apiVersion`/`kind` paths are
taken as written. Values are YAML scalars or flow collections (`32`, `true`, `[a.parquet, b.parquet]`, `null`),
so a value reads as it would in the file. The document is then validated as a whole: an override with a wrong
name gets the same "unknown field; did you mean" as the file would.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import yaml

from kuberl.api import yaml12

ROOT_KEYS = ("apiVersion", "kind", "metadata", "spec")


class OverrideError(ValueError):
    """A `--set` argument that cannot be applied; names the argument."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` → (["a", "b", "c"], value parsed as YAML)."""
    path, sep, raw = text.partition("=")
    if not sep or not path.strip():
        raise OverrideError(f"--set {text!r}: expected PATH=VALUE, e.g. batch.trainBatchSize=32")
    parts = path.strip().split(".")
    if any(not p for p in parts):
        raise OverrideError(f"--set {text!r}: empty name in the path {path!r}")
    try:
        value = yaml12.load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise OverrideError(f"--set {text!r}: the value is not valid YAML ({exc})") from exc
    if parts[0] not in ROOT_KEYS:
        parts = ["spec", *parts]
    return parts, value


def apply_overrides(doc: Any, overrides: list[str]) -> Any:
    """A copy of `doc` with every override set, in order (a later one wins)."""
    if not isinstance(doc, dict):
        raise OverrideError("--set needs the document to be a mapping (an RLJob)")
    result = copy.deepcopy(doc)
    for text in overrides:
        parts, value = parse_override(text)
        node: Any = result
        for depth, key in enumerate(parts[:-1]):
            node = _child(node, key, text, ".".join(parts[: depth + 1]))
        _assign(node, parts[-1], value, text)
    return result


def _child(node: Any, key: str, text: str, where: str) -> Any:
    if isinstance(node, list):
        index = _index(node, key, text)
        return node[index]
    if not isinstance(node, dict):
        raise OverrideError(f"--set {text!r}: {where} is a {type(node).__name__}, not an object")
    if node.get(key) is None:
        node[key] = {}
    return node[key]


def _assign(node: Any, key: str, value: Any, text: str) -> None:
    if isinstance(node, list):
        node[_index(node, key, text)] = value
    elif isinstance(node, dict):
        node[key] = value
    else:
        raise OverrideError(f"--set {text!r}: cannot set {key!r} inside a {type(node).__name__}")


def _index(node: list[Any], key: str, text: str) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise OverrideError(f"--set {text!r}: {key!r} is not an index of a list of {len(node)} items")
    return int(key)


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """`--set PATH=VALUE`, shared by `kuberl validate` and `kuberl run`."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field by its wire name below spec, e.g. --set batch.trainBatchSize=32 (repeatable)",
    )
