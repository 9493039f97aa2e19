"""The planning memo of strict YAML parses and schema verdicts: a hit gives what a parse would
(a fresh copy each time), a changed byte is parsed again, a refusal is never remembered, and a
memo file holding anything but plain data is ignored."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from int8alibi import parse_cache, strict_yaml
from int8alibi.errors import InputError

TEXT = "a: 1\nb: [x, 2026-01-01]\n3: null\n"


@pytest.fixture
def memo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "parse-cache.pickle"
    parse_cache.enable(path)
    yield path
    parse_cache._memo = None  # other tests parse without the memo


def test_a_hit_is_a_fresh_copy_of_the_same_value(memo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = strict_yaml.parse(TEXT, "t.yaml")
    parse_cache.save()
    parse_cache.enable(memo)
    monkeypatch.setattr(strict_yaml, "_load", lambda *a: pytest.fail("parsed although remembered"))
    again = strict_yaml.parse(TEXT, "t.yaml")
    assert again == first == {"a": 1, "b": ["x", "2026-01-01"], 3: None}
    again["a"] = 2
    assert strict_yaml.parse(TEXT, "t.yaml")["a"] == 1  # no shared state between callers


def test_a_changed_byte_is_parsed_again_and_a_refusal_is_never_kept(memo: Path) -> None:
    strict_yaml.parse(TEXT, "t.yaml")
    assert strict_yaml.parse(TEXT.replace("1", "5"), "t.yaml")["a"] == 5
    for _ in range(2):  # refused both times: nothing was remembered
        with pytest.raises(InputError, match="duplicate key"):
            strict_yaml.parse("a: 1\na: 2\n", "dup.yaml")


def test_a_schema_verdict_is_kept_only_when_it_passed(memo: Path) -> None:
    calls: list[str] = []

    def passes() -> None:
        calls.append("pass")

    def fails() -> None:
        calls.append("fail")
        raise InputError("no")

    parse_cache.validated({"type": "object"}, {"a": 1}, passes)
    parse_cache.validated({"type": "object"}, {"a": 1}, passes)
    assert calls == ["pass"]
    for _ in range(2):
        with pytest.raises(InputError):
            parse_cache.validated({"type": "object"}, {"a": 2}, fails)
    assert calls == ["pass", "fail", "fail"]


def test_a_memo_file_with_more_than_plain_data_is_ignored(memo: Path) -> None:
    memo.write_bytes(pickle.dumps({"yaml:x": Path("/etc")}))  # a class: refused when read
    parse_cache.enable(memo)
    assert parse_cache._memo is not None and parse_cache._memo.known == {}
    assert strict_yaml.parse(TEXT, "t.yaml")["a"] == 1
