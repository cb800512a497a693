"""`kuberl import-verl`'s input: a verl run read into verl's keys, each holding the value verl would run with.

A run is a launch script, a verl YAML, `key=value` overrides, or several in order (a later one wins). A script is
expanded as bash would (`kuberl.api.verl_shell`); the config the launch command names (`--config-name`, else
verl's `ppo_trainer`) is composed with verl's own config files (`kuberl.api.verl_hydra`) when they are here
(an installed verl, or `--verl-config DIR`). Without them, a run that names a config is refused with what is
needed, and a plain override list is read as written (with a note: verl's defaults were not read).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kuberl.api import yaml12
from kuberl.api.verl import VerlInputError, flatten, parse_override
from kuberl.api.verl_hydra import HydraError, Override, compose, find_config, verl_config_dir
from kuberl.api.verl_shell import Field, Launch, ShellError, Unknown, read_script

PPO_ENTRY = "verl.trainer.main_ppo"
PPO_CONFIG = "ppo_trainer"
NOT_RL = (
    (re.compile(r"sft"), "supervised fine-tuning (SFT)"),
    (re.compile(r"main_generation|main_generation_server"), "generation only"),
    (re.compile(r"main_eval"), "evaluation only"),
)
"""Entry modules of verl that do not train with RL, and what they do instead."""
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
YAML_SUFFIXES = (".yaml", ".yml", ".json")
RL_SECTIONS = {"actor_rollout_ref", "algorithm", "critic"}
"""Top-level sections only an RL run's config has (SFT and evaluation configs have data, trainer, model…)."""
VERL_INSTALL_HINT = "pip install --no-deps verl (its config files are all kuberl reads), or --verl-config DIR"


@dataclass
class VerlRun:
    values: dict[str, Any]
    """Every key of the run: dotted verl key → value (an `Unknown` where the script's value is not computed)."""
    explicit: set[str] | None
    """The keys the run sets itself (its script, YAML or arguments); None: all of them."""
    notes: list[str] = field(default_factory=list)


@dataclass
class _Reading:
    overrides: list[Override] = field(default_factory=list)
    primary: Path | None = None
    primary_name: str | None = None
    named_by: str = ""
    """Where the config to compose was named: `run.sh:12 --config-name`, or `the entry verl.trainer.main_ppo`."""
    search: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stated: set[str] = field(default_factory=set)
    """Keys a script or an argument sets (a flat YAML's keys count only where they differ from verl's)."""


def read_run(
    inputs: list[str],
    *,
    env: dict[str, str] | None = None,
    verl_config: str | Path | None = None,
    read_stdin: Callable[[], str] | None = None,
    installed_verl: bool = True,
) -> VerlRun:
    """The verl run of `inputs` (files, '-' for stdin, `key=value`), with `env` as the script's environment.

    verl's config files: `verl_config`, else (with `installed_verl`) the installed verl's, else none.
    """
    reading = _Reading()
    for item in inputs:
        if item != "-" and "=" in item and not Path(item).exists():
            reading.overrides.append(_argument_override(item))
            reading.stated.add(reading.overrides[-1].key)
            continue
        text = _read(item, read_stdin)
        if _is_yaml(item, text):
            _read_yaml(item, text, reading)
        else:
            _read_launch(item, text, dict(env or {}), reading)
    try:
        verl_dir = verl_config_dir(verl_config) if verl_config is not None or installed_verl else None
    except HydraError as exc:
        raise VerlInputError(str(exc)) from exc
    search = [*reading.search, *([verl_dir] if verl_dir else [])]
    primary = reading.primary
    if primary is None and reading.primary_name is not None:
        primary = find_config(reading.primary_name, search)
        if primary is None and (reading.named_by or verl_dir is not None):
            needed = f"{reading.primary_name}.yaml"
            where = ", ".join(map(str, search)) or "no folder"
            hint = VERL_INSTALL_HINT if verl_dir is None else "pass its folder with --config-path"
            raise VerlInputError(f"{reading.named_by or 'the run'} names {needed}, which is not in {where}: {hint}")
    if primary is None and verl_dir is not None:
        primary = verl_dir / f"{PPO_CONFIG}.yaml"
    if primary is None or (verl_dir is None and primary.parent not in reading.search):
        return _as_written(reading)
    try:
        composed = compose(primary, search, reading.overrides)
        base = compose(verl_dir / f"{PPO_CONFIG}.yaml", [verl_dir], []) if verl_dir else None
    except HydraError as exc:
        hint = f": {VERL_INSTALL_HINT}" if verl_dir is None else ""
        raise VerlInputError(f"{exc}{hint}") from exc
    if "actor_rollout_ref" not in composed.config:
        raise VerlInputError(_not_a_run(str(primary), composed.config))
    written = flatten(composed.config)
    values = {key: composed.get(key) for key in written}
    defaults = flatten(base.config) if base else {}
    set_keys = reading.stated
    # a key the run sets, or whose written value (before interpolation) differs from verl's ppo_trainer
    explicit = {key for key, raw in written.items() if key in set_keys or key not in defaults or defaults[key] != raw}
    return VerlRun(values, explicit, reading.notes)


def _as_written(reading: _Reading) -> VerlRun:
    """The run's own keys only: verl's config files are not here and the run names none."""
    values: dict[str, Any] = {}
    for override in reading.overrides:
        if override.prefix == "~":
            values.pop(override.key, None)
        else:
            values[override.key] = override.value
    note = (
        "verl's defaults were not read (verl is not installed here): keys the run does not set take kuberl's "
        f"defaults, which differ from verl's in places (docs/migrating-from-verl.md); {VERL_INSTALL_HINT}"
    )
    return VerlRun(values, None, [*reading.notes, note])


def _not_a_run(source: str, config: dict[str, Any]) -> str:
    keys = ", ".join(sorted(map(str, config))[:6])
    return (
        f"{source} is not an RL run's config: it has none of verl's RL sections ({', '.join(sorted(RL_SECTIONS))}), "
        f"only {keys}; an option of a config group (actor/dp_actor.yaml) is imported "
        "through the trainer config or script that uses it, and SFT or evaluation configs are not RL runs"
    )


def _read(item: str, read_stdin: Callable[[], str] | None) -> str:
    if item == "-":
        if read_stdin is None:
            raise VerlInputError("'-' reads stdin, which is not available here")
        return read_stdin()
    try:
        return Path(item).read_text()
    except OSError as exc:
        raise VerlInputError(f"cannot read {item}: {exc.strerror}") from exc


def _is_yaml(item: str, text: str) -> bool:
    if item.endswith(YAML_SUFFIXES):
        return True
    if item != "-":
        return False
    try:
        return isinstance(yaml12.load(text), dict)
    except yaml.YAMLError:
        return False


def _read_yaml(item: str, text: str, reading: _Reading) -> None:
    source = "<stdin>" if item == "-" else item
    try:
        config = yaml12.load(text, source)
    except yaml.YAMLError as exc:
        raise VerlInputError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise VerlInputError(f"{source}: a verl config is a mapping of sections, got {type(config).__name__}")
    if "defaults" not in config and not set(config) & RL_SECTIONS:
        raise VerlInputError(_not_a_run(source, config))
    if "defaults" in config:
        if item == "-":
            raise VerlInputError("<stdin>: a config with a defaults list must be a file (its folder is searched)")
        reading.primary = Path(item)
        reading.search.insert(0, Path(item).parent)
        return
    config.pop("hydra", None)
    reading.overrides += [Override(key, value) for key, value in flatten(config).items()]


def _argument_override(item: str) -> Override:
    parsed = parse_override(item)
    if parsed is None:
        raise VerlInputError(f"{item}: not a verl key=value override (e.g. data.train_batch_size=256)")
    prefix, key, value = parsed
    return Override(key, value, prefix)


def _read_launch(item: str, text: str, env: dict[str, str], reading: _Reading) -> None:
    source = "<stdin>" if item == "-" else item
    try:
        script = read_script(text, env)
    except ShellError as exc:
        raise VerlInputError(f"{source}: {exc}") from exc
    launch = _rl_launch(source, script.launches, script.notes)
    where = f"{source}:{launch.line}"
    reading.notes += [f"{source}: {note}" for note in script.notes]
    config_path: str | None = None
    words = iter(launch.args)
    for word in words:
        value = word.value
        flag = _config_flag(word.raw if isinstance(value, Unknown) else value)
        if flag is not None:
            name, inline = flag
            if inline is None:
                nxt = next(words, None)
                value = nxt.value if nxt is not None else ""
                inline = value if isinstance(value, str) else None
            if isinstance(value, Unknown) or inline is None:
                unknown = value if isinstance(value, Unknown) else Unknown("no value given", launch.line)
                raise VerlInputError(f"{where}: {name}={word.raw.partition('=')[2]}: {unknown}")
            if name == "--config-name":
                reading.primary_name = inline.removesuffix(".yaml")
                reading.named_by = f"{where} --config-name"
            else:
                config_path = inline
            continue
        if isinstance(value, Unknown):
            parsed = parse_override(word.raw.split("=", 1)[0] + "=x") if "=" in word.raw else None
            if parsed is None:
                raise VerlInputError(f"{where}: the argument {word.raw}: {value}")
            written = word.raw.split("=", 1)[1]
            unknown = Unknown(value.reason, value.line, value.variable, written)
            reading.overrides.append(Override(parsed[1], unknown, parsed[0]))
            reading.stated.add(parsed[1])
            continue
        parsed = parse_override(value)
        if parsed is None:
            reading.notes.append(f"{where}: the argument {value!r} is not a Hydra override: not read")
            continue
        reading.overrides.append(Override(parsed[1], parsed[2], parsed[0]))
        reading.stated.add(parsed[1])
    if config_path is not None:
        base = Path(source).parent if item != "-" else Path.cwd()
        folder = Path(config_path) if Path(config_path).is_absolute() else base / config_path
        if not folder.is_dir() and (Path.cwd() / config_path).is_dir():
            folder = Path.cwd() / config_path
        reading.search.insert(0, folder)
    if reading.primary_name is None and launch.entry != PPO_ENTRY:
        reading.notes.append(
            f"{where}: {launch.entry} is not {PPO_ENTRY}: its own code and config are not read; verl's "
            f"{PPO_CONFIG} defaults stand in for its config"
        )
    reading.notes += _environment_notes(where, launch.environment)


def _config_flag(text: str) -> tuple[str, str | None] | None:
    """(--config-name | --config-path | --config-dir, the value written with '=' or None) for Hydra's flags."""
    names = {"--config-name": "--config-name", "-cn": "--config-name", "--config-path": "--config-path"}
    names |= {"-cp": "--config-path", "--config-dir": "--config-path", "-cd": "--config-path"}
    flag, sep, value = text.partition("=")
    if flag not in names:
        return None
    return names[flag], value if sep else None


def _rl_launch(source: str, launches: list[Launch], notes: list[str]) -> Launch:
    """The one launch command that trains with RL; refused with the reason when there is none or several."""
    trainers = []
    for launch in launches:
        what = next((what for pattern, what in NOT_RL if pattern.search(launch.entry)), None)
        if what is not None:
            raise VerlInputError(
                f"{source}:{launch.line}: {launch.entry} is verl's {what}, not an RL run: kuberl trains with RL only"
            )
        trainers.append(launch)
    if not trainers:
        why = (
            "; ".join(notes) or "no command runs python -m verl.trainer.main_ppo (or another verl entry) with overrides"
        )
        raise VerlInputError(f"{source}: no verl launch command found ({why})")
    if len(trainers) > 1:
        lines = ", ".join(str(t.line) for t in trainers)
        raise VerlInputError(f"{source}: {len(trainers)} launch commands (lines {lines}); import one at a time")
    launch = trainers[0]
    if launch.conditional is not None:
        raise VerlInputError(
            f"{source}:{launch.line}: the launch command is {launch.conditional}; decide it with --env, or "
            "give the command's overrides as key=value"
        )
    return launch


def _environment_notes(where: str, environment: dict[str, Field]) -> list[str]:
    """What the launch command's environment holds: never copied into the RLJob, secrets never shown."""
    notes = []
    for name, value in environment.items():
        if SECRET_NAME.search(name):
            notes.append(
                f"{where}: {name} is a secret and is not copied: put it in a Secret and name it in "
                f"cluster.env[].valueFrom.secretKeyRef (docs/observability.md for WANDB_API_KEY)"
            )
        else:
            shown = value.written or value.reason if isinstance(value, Unknown) else value
            notes.append(f"{where}: environment {name}={shown} is not imported; an RLJob sets it in cluster.env")
    return notes
