"""Strict YAML reading and JSON-schema validation of protocol and amendment files.

Pinned files must mean one thing and cost little to read: they are parsed by ``int8alibi.strict_yaml``
(no anchors or aliases, no duplicate keys, bounded size and depth, dates stay strings), so an alias
bomb in an untracked amendment is a named ProtocolError, not a MemoryError.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from .. import parse_cache, strict_yaml
from ..errors import ProtocolError

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "protocol"


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text strictly; ``source`` names the file in any error."""
    return strict_yaml.parse(text, source, ProtocolError)


def read_yaml(path: Path, source: str | None = None) -> Any:
    """Read and strictly parse one YAML file."""
    return strict_yaml.read(path, source, ProtocolError)


@cache
def _schema(name: str) -> dict[str, Any]:
    path = SCHEMA_DIR / name
    data = read_yaml(path)
    parse_cache.validated("Draft 2020-12 meta-schema", data, lambda: _validator().check_schema(data))
    return data


def _validator() -> Any:
    """jsonschema's Draft 2020-12 validator, imported when something is validated anew (not on a cache hit)."""
    import jsonschema

    return jsonschema.Draft202012Validator


def validate(data: Any, schema_name: str, source: str) -> None:
    """Raise ProtocolError naming ``source`` and the first schema violation (by location)."""
    schema = _schema(schema_name)
    parse_cache.validated(schema, data, lambda: _check(schema, data, schema_name, source))


def _check(schema: dict[str, Any], data: Any, schema_name: str, source: str) -> None:
    validator = _validator()(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ProtocolError(f"{source}: does not match {schema_name} at {where}: {first.message}{more}")
