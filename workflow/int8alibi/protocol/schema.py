"""Strict YAML reading and JSON-schema validation of protocol and amendment files.

Pinned files must mean one thing: a duplicated mapping key (which plain YAML silently resolves to
the last value) is an error, and dates stay strings so a file reads the same on every machine.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ..errors import ProtocolError

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "protocol"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and does not turn dates into datetime objects."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text strictly; ``source`` names the file in any error."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ProtocolError(f"{source}: not valid YAML: {exc}") from None


def read_yaml(path: Path, source: str | None = None) -> Any:
    """Read and strictly parse one YAML file."""
    name = source or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProtocolError(f"{name}: file not found") from None
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{name}: not UTF-8 text: {exc}") from None
    return parse_yaml(text, name)


@cache
def _schema(name: str) -> dict[str, Any]:
    path = SCHEMA_DIR / name
    data = read_yaml(path)
    jsonschema.Draft202012Validator.check_schema(data)
    return data


def validate(data: Any, schema_name: str, source: str) -> None:
    """Raise ProtocolError naming ``source`` and the first schema violation (by location)."""
    validator = jsonschema.Draft202012Validator(_schema(schema_name))
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ProtocolError(f"{source}: does not match {schema_name} at {where}: {first.message}{more}")
