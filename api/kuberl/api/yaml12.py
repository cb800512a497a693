"""YAML read as kubectl reads it: `1e-6` is a number, as in YAML 1.2 (PyYAML's 1.1 rules make it a string).

Offline validation must see the same types the apiserver receives, so every manifest and `--set` value is
loaded through this loader.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class ManifestLoader(yaml.SafeLoader):
    """SafeLoader plus YAML 1.2 floats without a dot (`1e-6`, `5E3`)."""


ManifestLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load(text: str) -> Any:
    return yaml.load(text, Loader=ManifestLoader)  # a SafeLoader subclass


def load_all(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=ManifestLoader))  # a SafeLoader subclass
