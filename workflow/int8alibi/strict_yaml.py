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
    from .files.hashing import open_regular

    path = Path(path)
    name = source or str(path)
    if not path.exists() and not path.is_symlink():
        raise error(f"{name}: file not found")
    with open_regular(path, error) as handle:  # a FIFO or device is named, never waited on
        try:
            data = handle.read(MAX_BYTES + 1)
        except OSError as exc:
            raise error(f"{name}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_BYTES:
        raise error(f"{name}: more than the {MAX_BYTES} bytes a YAML file may have here")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{name}: not UTF-8 text: {exc}") from None
    if not text.strip():
        raise error(f"{name}: empty (a YAML mapping was expected)")
    return parse(text, name, error)


def main(argv: list[str] | None = None) -> int:
    """``python -m int8alibi.strict_yaml FILE ...``: one line per file, ``FILE: ok`` or what is wrong
    (read a config you did not write before handing it to Snakemake's own loader)."""
    import sys

    from .printable import printable

    files = sys.argv[1:] if argv is None else argv
    if not files:
        print("usage: python -m int8alibi.strict_yaml FILE ...", file=sys.stderr)
        return 2
    bad = 0
    for file in files:
        try:
            read(file)
        except InputError as exc:
            print(printable(exc), file=sys.stderr)
            bad += 1
        else:
            print(printable(f"{file}: ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
