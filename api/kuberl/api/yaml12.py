"""YAML read as kubectl reads it: `1e-6` is a number, as in YAML 1.2 (PyYAML's 1.1 rules make it a string).

Offline validation must see the same types the apiserver receives, so every manifest and `--set` value is
loaded through this loader.
"""

from __future__ import annotations

import io
import re
from typing import Any

import yaml


class ManifestLoader(yaml.SafeLoader):
    """SafeLoader plus YAML 1.2 floats without a dot (`1e-6`, `5E3`)."""


_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
ManifestLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


def load(text: str, source: str | None = None) -> Any:
    """`source` (a file name) is what a YAML error names instead of "<unicode string>"."""
    return yaml.load(_named(text, source), Loader=ManifestLoader)  # a SafeLoader subclass


def load_all(text: str, source: str | None = None) -> list[Any]:
    return list(yaml.load_all(_named(text, source), Loader=ManifestLoader))  # a SafeLoader subclass


def _named(text: str, source: str | None) -> str | io.StringIO:
    if source is None:
        return text
    stream = io.StringIO(text)
    stream.name = source  # PyYAML's reader names the stream in its errors
    return stream


class ManifestDumper(yaml.SafeDumper):
    """SafeDumper that quotes strings the ManifestLoader would read as numbers (`'1e-06'`)."""


ManifestDumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


def dump_all(documents: list[Any]) -> str:
    return yaml.dump_all(documents, Dumper=ManifestDumper, sort_keys=False, allow_unicode=True)


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=ManifestDumper, sort_keys=False, allow_unicode=True)
