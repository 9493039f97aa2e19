"""Strict, bounded YAML: anchors, aliases, merge keys, duplicate keys, deep nesting and oversized
files are refused with an error naming the file and the line; plain YAML reads as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from int8alibi import strict_yaml
from int8alibi.errors import InputError, ProtocolError


def alias_bomb(levels: int = 9) -> str:
    """The 'billion laughs' shape: each level lists the previous one nine times (9**levels leaves)."""
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for prev, name in zip("abcdefghij", "bcdefghijk"[: levels - 1]):
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    return text


def test_plain_yaml_reads_as_usual_and_dates_stay_strings() -> None:
    assert strict_yaml.parse("a: 1\nb: [x, true]\nwhen: 2026-12-01\n", "f.yaml") == {
        "a": 1, "b": ["x", True], "when": "2026-12-01"}


@pytest.mark.parametrize(("text", "line", "what"), [
    ("x: 1\ny: &anchor 2\n", 2, "anchor &anchor refused"),
    ("x: &a [1]\ny: *a\n", 1, "anchor &a refused"),
    ("x: 1\ny: *nowhere\n", 2, r"alias \*nowhere refused"),
    ("base: {a: 1}\nz:\n  <<: {a: 1}\n", 3, "merge key << refused"),
    ("model:\n  source: synthetic\n  source: hf\n", 3, "duplicate key 'source'"),
])
def test_refusals_name_the_file_and_the_line(text: str, line: int, what: str) -> None:
    with pytest.raises(InputError, match=rf"^cfg\.yaml: not valid YAML: line {line}: {what}"):
        strict_yaml.parse(text, "cfg.yaml")


def test_an_alias_bomb_is_refused_at_its_first_anchor(tmp_path: Path) -> None:
    path = tmp_path / "A-0099.yaml"
    path.write_text(alias_bomb())
    with pytest.raises(ProtocolError, match=r"A-0099\.yaml: not valid YAML: line 1: anchor &a refused"):
        strict_yaml.read(path, error=ProtocolError)


def test_deep_nesting_and_oversized_files_are_refused(tmp_path: Path) -> None:
    deep = "[" * (strict_yaml.MAX_DEPTH + 5) + "]" * (strict_yaml.MAX_DEPTH + 5)
    with pytest.raises(InputError, match=rf"deep\.yaml: not valid YAML: line 1: nested deeper than {strict_yaml.MAX_DEPTH}"):
        strict_yaml.parse(deep, "deep.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("x: '" + "a" * (strict_yaml.MAX_BYTES + 1) + "'\n")
    with pytest.raises(InputError, match=r"big\.yaml: more than the 1048576 bytes"):
        strict_yaml.read(big)


def test_unhashable_key_missing_file_and_binary_are_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"k\.yaml: not valid YAML: line 1: a mapping key must be a scalar"):
        strict_yaml.parse("? [1, 2]\n: x\n", "k.yaml")
    with pytest.raises(InputError, match=r"none\.yaml: file not found"):
        strict_yaml.read(tmp_path / "none.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match=r"bin\.yaml: not UTF-8 text"):
        strict_yaml.read(binary)


def test_special_files_empty_files_and_deep_files_end_in_one_named_error_quickly(tmp_path: Path) -> None:
    import os
    import time

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"config\.yaml: not a regular file \(a FIFO"):
        strict_yaml.read(fifo)  # a plain open would wait for a writer forever
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(InputError, match=r"folder\.yaml: not a regular file \(a folder\)"):
        strict_yaml.read(tmp_path / "folder.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("  \n")
    with pytest.raises(InputError, match=r"empty\.yaml: empty \(a YAML mapping was expected\)"):
        strict_yaml.read(empty)
    deep = tmp_path / "deep.yaml"
    deep.write_text("x: " + "[" * 5000 + "]" * 5000 + "\n")
    started = time.monotonic()
    with pytest.raises(InputError, match=r"deep\.yaml: not valid YAML: line 1: nested deeper than"):
        strict_yaml.read(deep)
    assert time.monotonic() - started < 5


def test_the_checker_prints_one_line_per_file_with_names_escaped(tmp_path: Path, capsys) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("a: 1\n")
    hostile = tmp_path / "bad\nerror: fake verdict\x1b[0m.yaml"
    hostile.write_text("a: &x 1\n")
    assert strict_yaml.main([str(good), str(hostile)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{good}: ok"]
    lines = err.splitlines()
    assert len(lines) == 1 and "bad\\x0aerror: fake verdict\\x1b[0m.yaml" in lines[0] and "anchor &x refused" in lines[0]
