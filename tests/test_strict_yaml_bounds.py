"""The strict YAML bounds at their literal values, each side: 64 levels of nesting, 1 MiB of text
(characters for a string, bytes for a file: a multi-byte file is refused by its bytes first); and the
two failures no bound stops (a stack exhausted anyway, a read error) as one named line."""

from __future__ import annotations

import errno
import io
import sys
from pathlib import Path

import pytest

from int8alibi import strict_yaml
from int8alibi.errors import InputError

MIB = 1024 * 1024


def _nested(levels: int) -> str:
    """A flow sequence ``levels`` deep (each bracket is one node, the innermost list empty)."""
    return "[" * levels + "]" * levels


def test_sixty_four_levels_read_and_sixty_five_are_refused() -> None:
    value = strict_yaml.parse(_nested(64), "deep.yaml")
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0] if value else None
    assert depth == 64
    with pytest.raises(InputError, match="deep.yaml: not valid YAML: line 1: nested deeper than 64 levels"):
        strict_yaml.parse(_nested(65), "deep.yaml")


def test_a_mapping_nests_like_a_sequence() -> None:
    text = "".join("  " * i + "k:\n" for i in range(63)) + "  " * 63 + "k: 1\n"   # 64 mappings, then the scalar
    with pytest.raises(InputError, match="nested deeper than 64"):
        strict_yaml.parse(text, "m.yaml")
    shallower = "".join("  " * i + "k:\n" for i in range(62)) + "  " * 62 + "k: 1\n"  # 63 mappings + scalar
    value = strict_yaml.parse(shallower, "m.yaml")
    for _ in range(63):
        value = value["k"]
    assert value == 1


def _text_of(length: int, filler: str = "a") -> str:
    """A one-key YAML document of exactly ``length`` characters."""
    head, tail = "x: '", "'\n"
    body = length - len(head) - len(tail)
    assert body % len(filler) == 0
    return head + filler * (body // len(filler)) + tail


def test_one_mib_of_text_reads_and_one_character_more_is_refused() -> None:
    assert strict_yaml.parse(_text_of(MIB), "s.yaml") == {"x": "a" * (MIB - 6)}
    with pytest.raises(InputError, match=rf"^s\.yaml: {MIB + 1} characters, more than the {MIB}"):
        strict_yaml.parse(_text_of(MIB + 1), "s.yaml")


def test_a_file_is_bounded_by_its_bytes(tmp_path: Path) -> None:
    exact = tmp_path / "exact.yaml"
    exact.write_text(_text_of(MIB), encoding="utf-8")
    assert exact.stat().st_size == MIB and strict_yaml.read(exact) == {"x": "a" * (MIB - 6)}
    over = tmp_path / "over.yaml"
    over.write_text(_text_of(MIB + 1), encoding="utf-8")
    with pytest.raises(InputError, match=rf"over\.yaml: .*more than the {MIB}"):
        strict_yaml.read(over)
    # Two bytes per character: 600,000 characters (within the text bound) are 1.2 MB on disk.
    wide = tmp_path / "wide.yaml"
    text = _text_of(600_000, "é")
    wide.write_text(text, encoding="utf-8")
    assert len(text) <= MIB < wide.stat().st_size
    with pytest.raises(InputError, match=rf"wide\.yaml: .*more than the {MIB}"):
        strict_yaml.read(wide)


def test_a_directory_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"a folder|a directory"):
        strict_yaml.read(tmp_path)


def test_depth_is_nesting_not_the_number_of_nodes() -> None:
    """Siblings do not add up: 300 entries side by side, each two levels down, read."""
    text = "top:\n" + "".join(f"  k{i}: [{i}]\n" for i in range(300))
    assert strict_yaml.parse(text, "wide.yaml")["top"]["k299"] == [299]
    assert strict_yaml.parse(_nested(60) + "\n", "d.yaml") is not None
    assert strict_yaml.parse("[" + ", ".join([_nested(63)] * 50) + "]", "d.yaml")[49] == strict_yaml.parse(
        _nested(63), "d.yaml")


def test_a_recursion_the_depth_bound_does_not_stop_is_still_one_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the bound out of the way, as many levels as Python allows frames (each level takes several)
    exhaust the stack: still the file's one error."""
    monkeypatch.setattr(strict_yaml, "MAX_DEPTH", 10**9)
    with pytest.raises(InputError, match=r"^deep\.yaml: not valid YAML: nested too deeply$"):
        strict_yaml.parse(_nested(sys.getrecursionlimit()), "deep.yaml")


def test_a_read_error_is_one_named_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk or network file system that fails mid-read (EIO) is named with the reason, not a traceback."""
    from int8alibi.files import hashing

    class Failing(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

    (tmp_path / "c.yaml").write_text("a: 1\n")
    monkeypatch.setattr(hashing, "open_regular", lambda path, error: Failing())
    with pytest.raises(InputError, match=r"c\.yaml: cannot be read \(Input/output error\)$"):
        strict_yaml.read(tmp_path / "c.yaml")
