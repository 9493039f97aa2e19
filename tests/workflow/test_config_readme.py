"""config/README.md describes every key the config schema accepts."""

from __future__ import annotations

import re

import yaml

from .conftest import PROJECT


def _keys(schema: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, sub in (schema.get("properties") or {}).items():
        key = f"{prefix}{name}"
        keys.append(key)
        if key != "resolved":  # written by the pipeline; its fields are described in one row
            keys += _keys(sub, f"{key}.")
    return keys


def test_every_config_key_has_a_row() -> None:
    schema = yaml.safe_load((PROJECT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    readme = (PROJECT / "config" / "README.md").read_text()
    rows = set(re.findall(r"^\| `([\w.]+)` \|", readme, re.M))
    missing = [key for key in _keys(schema) if key not in rows and not (schema["properties"].get(key) or {}).get("properties")]
    # a key with sub-keys is described by its sub-keys' rows
    missing = [key for key in missing if not any(row.startswith(f"{key}.") for row in rows)]
    assert not missing, f"config/README.md has no row for: {missing}"
    for name in ["config.yaml", "qwen3-1.7b.yaml", "qwen3-8b.yaml", "qwen3-14b.yaml"]:
        assert f"`{name}`" in readme
