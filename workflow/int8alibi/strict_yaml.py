"""Bounded, strict YAML for every file the pipeline reads itself (configs, protocol, amendments, profiles).

A file must mean one thing and cost little to read: anchors and aliases are refused (a 2 KB alias
"bomb" expands to gigabytes when walked), so are duplicate mapping keys (plain YAML keeps the last
silently), nesting deeper than ``MAX_DEPTH`` and files larger than ``MAX_BYTES``. Dates stay
strings so a file reads the same on every machine. Every refusal names the file and the line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from . import parse_cache
from .errors import InputError

MAX_BYTES = 1 << 20  # 1 MiB: the largest protocol file is a few KB
MAX_DEPTH = 64


class StrictYAMLError(yaml.YAMLError):
    """A construct the strict loader refuses, with the line it starts on (1-based)."""

    def __init__(self, message: str, mark: yaml.Mark | None) -> None:
        line = f"line {mark.line + 1}: " if mark is not None else ""
        super().__init__(f"{line}{message}")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader without anchors, aliases, duplicate keys, timestamps or deep nesting."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise StrictYAMLError(f"alias *{event.anchor} refused (anchors and aliases are not allowed)",
                                  event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise StrictYAMLError(f"anchor &{event.anchor} refused (anchors and aliases are not allowed)",
                                  event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise StrictYAMLError(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise StrictYAMLError("merge key << refused", key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key (a list or mapping used as a key)
                raise StrictYAMLError("a mapping key must be a scalar", key_node.start_mark) from None
            if duplicate:
                raise StrictYAMLError(f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def parse(text: str, source: str, error: type[Exception] = InputError) -> Any:
    """Parse YAML ``text`` strictly; any refusal raises ``error`` naming ``source`` and the line."""
    if len(text) > MAX_BYTES:
        raise error(f"{source}: {len(text)} characters, more than the {MAX_BYTES} a YAML file may have here")
    return parse_cache.parsed(text, lambda: _load(text, source, error))


def _load(text: str, source: str, error: type[Exception]) -> Any:
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc}") from None
    except RecursionError:
        raise error(f"{source}: not valid YAML: nested too deeply") from None


def read(path: str | Path, source: str | None = None, error: type[Exception] = InputError) -> Any:
    """Read and strictly parse one YAML file (at most ``MAX_BYTES``); errors name ``source`` or the path."""
    path = Path(path)
    name = source or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise error(f"{name}: {size} bytes, more than the {MAX_BYTES} a YAML file may have here")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{name}: file not found") from None
    except IsADirectoryError:
        raise error(f"{name}: a directory, not a YAML file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{name}: not UTF-8 text: {exc}") from None
    return parse(text, name, error)
