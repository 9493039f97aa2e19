"""``python -m int8alibi.strict_yaml FILE ...``: a line per file, exit 0 when every file reads, 1
when any does not (each named), 2 without files; the files come from the command line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from int8alibi import strict_yaml


def test_every_file_is_named_and_the_exit_status_counts_any_failure(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    good, bad, other = tmp_path / "good.yaml", tmp_path / "bad.yaml", tmp_path / "other.yaml"
    good.write_text("a: 1\n")
    other.write_text("b: [1, 2]\n")
    bad.write_text("a: &x 1\nb: *x\n")
    assert strict_yaml.main([str(good), str(other)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{good}: ok", f"{other}: ok"]
    assert strict_yaml.main([str(good), str(bad), str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"{good}: ok"]
    assert captured.err.count("bad.yaml") == 2 and "anchor &x refused" in captured.err


def test_without_files_it_says_how_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert strict_yaml.main([]) == 2
    assert "usage: python -m int8alibi.strict_yaml FILE" in capsys.readouterr().err


def test_the_files_are_read_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("a: 1\n")
    second.write_text("a: 1\na: 2\n")
    monkeypatch.setattr(sys, "argv", ["strict_yaml", str(first), str(second)])
    assert strict_yaml.main() == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"{first}: ok"] and "duplicate key 'a'" in captured.err
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "no-such-program"), str(first)])   # the program is no file
    assert strict_yaml.main() == 0
    assert capsys.readouterr().err == ""
