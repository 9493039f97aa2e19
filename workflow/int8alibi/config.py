"""Run configuration: one YAML file, validated against workflow/schemas/config.schema.yaml.

Paths may name environment variables (``${QWEN3_DIR}``) so the same config serves every machine.

When Snakemake plans a run it writes the *run config* (``<results>/.run/config.yaml``): the user's
config with its environment variables expanded and a ``resolved`` block holding the device and the
arm pair that ``auto`` stood for, with the reason and the host that decided (``int8alibi.resolve``).
Stages read that file and never expand or resolve again.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml

from .errors import InputError

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
# The block the pipeline writes into the run config when it plans a run (never set by hand).
RESOLVED = "resolved"
_VARIABLE = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Config:
    """A validated configuration plus the file it came from."""

    data: Mapping[str, Any]
    path: Path

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def exploratory(self) -> bool:
        return bool(self.data["exploratory"])

    @property
    def results(self) -> Path:
        return Path(self.data.get("results", "results"))

    @property
    def resolution(self) -> Mapping[str, Any] | None:
        """The ``resolved`` block of a run config (device, arms, reason, host), or None for a user config."""
        block = self.data.get(RESOLVED)
        if block is None:
            return None
        spec = {"device": self.data["device"], "arms": self.data["arms"]}
        if block["spec"] != spec:
            raise InputError(f"{self.path}: the resolved block was planned for device {block['spec']['device']!r}, "
                             f"arms {block['spec']['arms']!r}, but the config now says device {spec['device']!r}, "
                             f"arms {spec['arms']!r}; let Snakemake plan the run again (it rewrites this file)")
        return block

    @property
    def resolved_device(self) -> str:
        """``cpu`` or ``cuda``: the run's device as resolved once when the run was planned (or as named)."""
        block = self.resolution
        if block is not None:
            return str(block["device"])
        if self.data["device"] == "auto":
            raise InputError(_unresolved(self.path, "device"))
        return str(self.data["device"])

    @property
    def resolved_arms(self) -> list[str]:
        """The two arm names of the run, as resolved once when the run was planned (or as named)."""
        block = self.resolution
        if block is not None:
            return [str(a) for a in block["arms"]]
        if self.data["arms"] == "auto":
            raise InputError(_unresolved(self.path, "arms"))
        return [str(a) for a in self.data["arms"]]


def _unresolved(path: Path, key: str) -> str:
    return (f"{path}: {key}: auto is resolved once per run, when Snakemake plans it (the 'resolved' block of "
            f"<results>/.run/config.yaml); this config has no such block: run the stage through Snakemake, "
            f"pass that run config, or name the {key} explicitly")


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise InputError(f"override {text!r}: expected key=value (e.g. exploratory=true)")
    key, value = text.split("=", 1)
    return key.split("."), yaml.safe_load(value)


def apply_overrides(data: dict[str, Any], overrides: list[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (YAML-typed values), as Snakemake's --config does."""
    out = copy.deepcopy(data)
    items = overrides.items() if isinstance(overrides, Mapping) else (_parse_override(o) for o in overrides)
    for key, value in items:
        parts = key.split(".") if isinstance(key, str) else key
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _variables(text: str) -> list[str]:
    return [braced or bare for braced, bare in _VARIABLE.findall(text)]


def _expand_env(value: Any, unset: list[str] | None = None, where: str = "") -> Any:
    """Expand ``$VAR``/``${VAR}`` in every string; an unset variable raises, or is left as written
    and its ``(where, name)`` appended to ``unset`` when a list is given."""
    if isinstance(value, str):
        expanded = os.path.expandvars(value)
        left = _variables(expanded)
        if left:
            if unset is None:
                raise InputError(f"config value {value!r}{f' ({where})' if where else ''} names environment "
                                 f"variable {left[0]}, which is not set")
            unset.extend(f"{where or '(top level)'}: ${{{name}}}" for name in left)
        return expanded
    if isinstance(value, Mapping):
        return {k: _expand_env(v, unset, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, unset, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def expand_env(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` with environment variables expanded, and the ``"key: ${VAR}"`` entries left unexpanded
    because the variable is not set (those stay as written: a job that reads the run config then stops)."""
    unset: list[str] = []
    return _expand_env(dict(data), unset), unset


def _written_variables(value: Any, where: str = "") -> list[str]:
    """``"key: ${VAR}"`` for every variable reference written in ``value`` (nothing is expanded)."""
    if isinstance(value, str):
        return [f"{where or '(top level)'}: ${{{name}}}" for name in _variables(value)]
    if isinstance(value, Mapping):
        return [hit for k, v in value.items() for hit in _written_variables(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in _written_variables(v, f"{where}[{i}]")]
    return []


def _check_planned(data: Mapping[str, Any], path: Path) -> None:
    """A run config was expanded when the run was planned: a variable left in it was not set then.

    It is not expanded now (the value this host would give is not what the run was planned with).
    """
    written = _written_variables({k: v for k, v in data.items() if k != RESOLVED})
    if written:
        host = data[RESOLVED].get("host", "the planning host")
        raise InputError(f"{path}: {written[0]} was not expanded: the environment variable was not set when "
                         f"Snakemake planned this run on host {host}; set it and run snakemake again")


def validate(data: Mapping[str, Any], source: str) -> None:
    """Raise InputError naming the file and the first schema violation."""
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    try:
        jsonschema.validate(dict(data), schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise InputError(f"{source}: invalid config at {where}: {exc.message}") from None


def load_config(path: str | Path, overrides: list[str] | Mapping[str, Any] = ()) -> Config:
    """Load, override, expand environment variables and validate a config file.

    A run config (one with a ``resolved`` block) is not expanded again: a variable still written in
    it was unset when the run was planned, and reading it stops with an error naming the variable.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: config must be a mapping")
    data = apply_overrides(raw, overrides)
    if RESOLVED in data:  # a run config: expanded and resolved when the run was planned; read, never redo
        validate(data, str(path))
        _check_planned(data, path)
    else:
        data = _expand_env(data)
        validate(data, str(path))
    return Config(data=data, path=path)


def read_run_config(path: Path) -> dict[str, Any] | None:
    """The run config an earlier plan wrote at ``path``, or None when there is none (or it is unreadable)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def write_effective_config(data: Mapping[str, Any], path: Path) -> Path:
    """Write the run config (file + command-line overrides, expanded, with its resolved block) for the stages.

    Rewritten only when its content changes, atomically, so its timestamp never causes reruns.
    """
    text = yaml.safe_dump(dict(data), sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return path
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # cluster jobs may plan at the same time
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
