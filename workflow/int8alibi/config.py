"""Run configuration: one YAML file, validated against workflow/schemas/config.schema.yaml.

Paths may name environment variables (``${QWEN3_DIR}``) so the same config serves every machine.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml

from .errors import InputError

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"


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


def _expand_env(value: Any) -> Any:
    if isinstance(value, str):
        expanded = os.path.expandvars(value)
        if "$" in expanded:
            raise InputError(f"config value {value!r} names an environment variable that is not set")
        return expanded
    if isinstance(value, dict):
        return {k: _expand_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v) for v in value]
    return value


def validate(data: Mapping[str, Any], source: str) -> None:
    """Raise InputError naming the file and the first schema violation."""
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    try:
        jsonschema.validate(dict(data), schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise InputError(f"{source}: invalid config at {where}: {exc.message}") from None


def load_config(path: str | Path, overrides: list[str] | Mapping[str, Any] = ()) -> Config:
    """Load, override, expand environment variables and validate a config file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: config must be a mapping")
    data = _expand_env(apply_overrides(raw, overrides))
    validate(data, str(path))
    return Config(data=data, path=path)


def write_effective_config(data: Mapping[str, Any], path: Path) -> Path:
    """Write the merged config (file + command-line overrides) for the stages to read.

    Rewritten only when its content changes, atomically, so its timestamp never causes reruns.
    """
    text = yaml.safe_dump(dict(data), sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return path
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
