"""verl's configuration as Hydra composes it, without Hydra: what a verl run would hold in every key.

Read as Hydra 1.3 reads them: a config's `defaults:` list (config groups with `@package`, relative `../group`
paths, `${group}` choices, `override`, `_self_`, appended last when absent), `# @package _global_` headers,
command-line overrides (`key=value`, `+key`, `++key`, `~key`, and `group=option` for a group of the defaults
list), and `${…}` interpolations (absolute, relative `${.x}`, `oc.select`, `oc.env`) of the keys asked for.

Configs are found on a search path: the run's own folders (`--config-path`, the folder of a YAML given) first,
then verl's `verl/trainer/config` (an installed verl, or `--verl-config DIR`).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kuberl.api import yaml12

MISSING = "???"  # OmegaConf's mandatory value: not set
_PACKAGE_HEADER = re.compile(r"^#\s*@package\s+(\S+)", re.MULTILINE)
_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


class HydraError(ValueError):
    """A configuration that cannot be composed: names the file or the entry, and what is needed."""


def verl_config_dir(explicit: str | Path | None = None) -> Path | None:
    """verl's `trainer/config` folder: `explicit`, else the installed verl's (found without importing it)."""
    if explicit is not None:
        folder = Path(explicit)
        if not (folder / "ppo_trainer.yaml").is_file():
            raise HydraError(f"--verl-config {folder}: no ppo_trainer.yaml there (expected verl/trainer/config)")
        return folder
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "trainer" / "config"
        if (folder / "ppo_trainer.yaml").is_file():
            return folder
    return None


@dataclass(frozen=True)
class Override:
    """One Hydra command-line override: `key=value`, `+key=value`, `++key=value` or `~key`."""

    key: str
    value: Any
    prefix: str = ""


@dataclass
class Composed:
    config: dict[str, Any]
    """The nested configuration, interpolations unresolved."""
    files: list[Path] = field(default_factory=list)
    """Every file read, in order."""

    def get(self, dotted: str) -> Any:
        """The value at `dotted`, interpolations resolved; None when absent or `???`."""
        return _resolve(self.config, dotted, set())


def compose(primary: Path, search: list[Path], overrides: list[Override]) -> Composed:
    """`primary` composed with its defaults found on `search`, then `overrides` applied, as Hydra would."""
    composer = _Composer(search)
    for override in overrides:
        if not override.prefix and composer.is_group(override.key):
            composer.fixed[override.key] = str(override.value)
    config: dict[str, Any] = {}
    composer.load(primary, package="", into=config, group="")
    config.pop("hydra", None)
    for override in overrides:
        if not override.prefix and override.key in composer.choices_seen:
            continue
        _apply(config, override)
    return Composed(config, composer.files)


def find_config(name: str, search: list[Path]) -> Path | None:
    file = name if name.endswith(".yaml") else f"{name}.yaml"
    return next((folder / file for folder in search if (folder / file).is_file()), None)


class _Composer:
    def __init__(self, search: list[Path]) -> None:
        self.search = search
        self.fixed: dict[str, str] = {}
        """Group choices fixed before they are reached: command-line `group=option` and `override` entries."""
        self.chosen: dict[str, str] = {}
        """The option taken for each group so far, for `${group}` in later entries."""
        self.choices_seen: set[str] = set()
        self.files: list[Path] = []

    def is_group(self, key: str) -> bool:
        group = key.split("@")[0]
        return any((folder / group).is_dir() for folder in self.search)

    def find(self, group: str, name: str, requested_by: Path) -> Path:
        relative = f"{group}/{name}" if group else name
        found = find_config(relative, self.search)
        if found is None:
            where = ", ".join(str(f) for f in self.search)
            raise HydraError(f"{requested_by}: its defaults need {relative}.yaml, which is not in {where}")
        return found

    def load(self, path: Path, package: str, into: dict[str, Any], group: str) -> None:
        try:
            stat = path.stat()
            text, parsed = _read_config(path, stat.st_mtime_ns, stat.st_size)
        except (OSError, yaml.YAMLError) as exc:
            raise HydraError(f"{path}: cannot read: {exc}") from exc
        content = copy.deepcopy(parsed) or {}
        if not isinstance(content, dict):
            raise HydraError(f"{path}: a config is a mapping, got {type(content).__name__}")
        self.files.append(path)
        header = _PACKAGE_HEADER.search(text.split("\n\n", 1)[0])
        if header is not None:
            package = "" if header.group(1) == "_global_" else header.group(1)
        defaults = content.pop("defaults", None) or []
        if not isinstance(defaults, list):
            raise HydraError(f"{path}: defaults must be a list")
        if "_self_" not in defaults:
            defaults = [*defaults, "_self_"]
        for entry in defaults:
            if isinstance(entry, dict) and len(entry) == 1:
                key, option = next(iter(entry.items()))
                if str(key).startswith("override "):
                    name = str(key).removeprefix("override ").strip().lstrip("/")
                    self.fixed.setdefault(name, str(option))
        for entry in defaults:
            if entry == "_self_":
                _merge(_node(into, package), content)
            elif isinstance(entry, str):
                name = entry.removeprefix("optional ").strip()
                _merge_file = self.find(group, name, path)
                self.load(_merge_file, package, into, group)
            elif isinstance(entry, dict) and len(entry) == 1:
                key, option = next(iter(entry.items()))
                key = str(key)
                if key.startswith("override "):
                    continue
                optional = key.startswith("optional ")
                key = key.removeprefix("optional ").strip()
                group_path, _, at = key.partition("@")
                option = self.fixed.get(key, self.fixed.get(group_path, option))
                self.choices_seen.add(key)
                if option is None:
                    continue
                option = _choice(str(option), self.chosen, path)
                self.chosen[group_path] = option
                resolved_group = _join_group(group, group_path)
                child_package = _join(package, at if at else resolved_group.replace("/", "."))
                try:
                    child = self.find(resolved_group, option, path)
                except HydraError:
                    if optional:
                        continue
                    raise
                self.load(child, child_package, into, resolved_group)
            else:
                raise HydraError(f"{path}: cannot read the defaults entry {entry!r}")


@functools.lru_cache(maxsize=512)
def _read_config(path: Path, mtime_ns: int, size: int) -> tuple[str, Any]:
    """A config file's text and content, parsed once per version of the file (a run composes ~50 of them)."""
    text = path.read_text()
    return text, yaml12.load(text)


def _choice(option: str, choices: dict[str, str], path: Path) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in choices:
            raise HydraError(f"{path}: the defaults entry {option!r} reads ${{{name}}}, a group not chosen before it")
        return choices[name]

    return _INTERPOLATION.sub(replace, option)


def _join_group(current: str, group: str) -> str:
    if group.startswith("/"):
        return group.lstrip("/")
    parts = [p for p in current.split("/") if p]
    for piece in group.split("/"):
        if piece == "..":
            if parts:
                parts.pop()
        elif piece:
            parts.append(piece)
    return "/".join(parts)


def _join(package: str, child: str) -> str:
    if child.startswith("_global_"):
        return child.removeprefix("_global_").lstrip(".")
    return f"{package}.{child}" if package and child else package or child


def _node(root: dict[str, Any], package: str) -> dict[str, Any]:
    node = root
    for part in [p for p in package.split(".") if p]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    return node


def _merge(into: dict[str, Any], content: dict[str, Any]) -> None:
    for key, value in content.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _apply(config: dict[str, Any], override: Override) -> None:
    *parents, last = override.key.split(".")
    node = config
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if override.prefix == "~":
        node.pop(last, None)
    else:
        node[last] = override.value


def _lookup(config: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _resolve(config: dict[str, Any], dotted: str, seen: set[str]) -> Any:
    found, value = _lookup(config, dotted)
    if not found:
        return None
    return _resolve_value(config, dotted, value, seen)


def _resolve_value(config: dict[str, Any], dotted: str, value: Any, seen: set[str]) -> Any:
    if isinstance(value, str):
        if value == MISSING:
            return None
        whole = _INTERPOLATION.fullmatch(value.strip())
        if whole is not None:
            return _interpolate(config, dotted, whole.group(1), seen)
        if "${" in value:
            return _INTERPOLATION.sub(lambda m: str(_interpolate(config, dotted, m.group(1), seen)), value)
    if isinstance(value, list):
        return [_resolve_value(config, dotted, item, seen) for item in value]
    return value


def _interpolate(config: dict[str, Any], dotted: str, expression: str, seen: set[str]) -> Any:
    """`${a.b}`, `${.sibling}`, `${oc.select:a.b,default}`, `${oc.env:NAME,default}` (the environment of a
    pod is not known here: the default, else None)."""
    expression = expression.strip()
    if expression.startswith("oc.env:"):
        _, _, env_default = expression.removeprefix("oc.env:").partition(",")
        return yaml12.load(env_default) if env_default.strip() else None
    default: Any = None
    if expression.startswith("oc.select:"):
        target, _, raw_default = expression.removeprefix("oc.select:").partition(",")
        default = yaml12.load(raw_default) if raw_default.strip() else None
    elif ":" in expression:
        return None  # a resolver kuberl does not know (oc.decode, …): the value is not read
    else:
        target = expression
    target = target.strip()
    if target.startswith("."):
        depth = len(target) - len(target.lstrip("."))
        base = dotted.split(".")[:-depth]
        target = ".".join([*base, target.lstrip(".")])
    if target in seen:
        return default
    found, value = _lookup(config, target)
    if not found or value == MISSING:
        return default
    resolved = _resolve_value(config, target, value, seen | {target})
    return default if resolved is None else resolved
