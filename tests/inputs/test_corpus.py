"""Corpus sources, the digest pin, the window rule's boundaries, and the protocol's prompts."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from int8alibi.config import Config
from int8alibi.inputs.corpus import (
    PACKAGE_FILE,
    PACKAGE_SOURCE,
    load_corpus,
    package_text,
    prompt_digest,
    prompt_texts,
    prompts,
    synthetic_text,
    text_digest,
    windows,
)
from int8alibi.errors import InputError, ProtocolError

ROOT = Path(__file__).resolve().parents[2]
WIKI = " = Robert Boulter = \n\n Robert Boulter is an English film , television and theatre actor .\n\n" \
       " = = Career = = \n\n In 2000 Boulter had a guest @-@ starring role .\n"


def cfg(source: str, path: str | None = None) -> Config:
    return Config(data={"corpus": {"source": source, "path": path}}, path=Path("test.yaml"))


def pinned(digest: str, source: str = PACKAGE_SOURCE) -> dict[str, Any]:
    return {"corpus": {"package": {"source": source, "sha256": digest}}}


class WordTokenizer:
    """Whitespace tokenizer with a BOS id, called like a Hugging Face tokenizer."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [1] + [len(w) + 10 for w in text.split()]}


def test_package_corpus_verifies_against_its_pin_and_names_both_digests_on_mismatch() -> None:
    text = package_text()
    assert len(text) > 100_000 and "assert" in text
    good = load_corpus(cfg("package"), pinned(text_digest(text)))
    assert (good.name, good.sha256, good.pin) == (f"package:{PACKAGE_SOURCE}", text_digest(text), "protocol")
    wrong = "0" * 64
    with pytest.raises(InputError) as err:
        load_corpus(cfg("package"), pinned(wrong))
    assert PACKAGE_SOURCE in str(err.value) and wrong in str(err.value) and text_digest(text) in str(err.value)


def test_package_corpus_without_a_pin_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="corpus.package.sha256"):
        load_corpus(cfg("package"), {})
    with pytest.raises(ProtocolError, match="corpus.package.source"):
        load_corpus(cfg("package"), pinned(text_digest(package_text()), source="textwrap"))


def test_the_registered_protocol_pins_the_shipped_corpus() -> None:
    """The pin must exist and match the file the package ships: a missing pin fails, never skips."""
    from int8alibi.protocol import load

    analysis = load(ROOT / "preregistration").analysis
    assert analysis["corpus"]["package"]["source"] == PACKAGE_SOURCE
    assert load_corpus(cfg("package"), analysis).pin == "protocol"


def test_the_shipped_corpus_does_not_depend_on_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever pydoc_data this Python has, the corpus is the file shipped with the package."""
    import sys
    import types

    fake = types.ModuleType("pydoc_data.topics")
    fake.topics = {"a": "another release's text"}
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", fake)
    assert package_text() == PACKAGE_FILE.read_bytes().decode("utf-8")
    assert (PACKAGE_FILE.parent / "pydoc-topics-3.11.7.LICENSE.txt").read_text().count("PYTHON SOFTWARE FOUNDATION") >= 1


def test_a_missing_or_changed_corpus_file_is_a_named_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from int8alibi.inputs import corpus as corpus_module
    from int8alibi.protocol import load

    analysis = load(ROOT / "preregistration").analysis
    monkeypatch.setattr(corpus_module, "PACKAGE_FILE", tmp_path / "gone.txt")
    with pytest.raises(InputError, match="gone.txt: the embedded corpus file is missing"):
        load_corpus(cfg("package"), analysis)
    changed = tmp_path / "changed.txt"
    changed.write_text(PACKAGE_FILE.read_text(encoding="utf-8") + " ", encoding="utf-8")
    monkeypatch.setattr(corpus_module, "PACKAGE_FILE", changed)
    with pytest.raises(InputError, match="changed.txt is not the text the protocol was registered with"):
        load_corpus(cfg("package"), analysis)


def test_wikitext_raw_file_loads_and_other_texts_are_refused(tmp_path: Path) -> None:
    raw = tmp_path / "wiki.test.raw"
    raw.write_text(WIKI, encoding="utf-8")
    corpus = load_corpus(cfg("wikitext", str(raw)), {})
    assert corpus.text == WIKI and corpus.sha256 == text_digest(WIKI)
    assert corpus.pin.startswith("not pinned")
    assert load_corpus(cfg("wikitext", str(raw)), {"corpus": {"wikitext": {"sha256": text_digest(WIKI)}}}).pin == "protocol"
    with pytest.raises(InputError, match="differs from the protocol's pin"):
        load_corpus(cfg("wikitext", str(raw)), {"corpus": {"wikitext": {"sha256": "f" * 64}}})

    tokenized = tmp_path / "wiki.test.tokens"
    tokenized.write_text(WIKI.replace("Boulter had", "<unk> had"), encoding="utf-8")
    with pytest.raises(InputError, match="tokenized WikiText"):
        load_corpus(cfg("wikitext", str(tokenized)), {})
    prose = tmp_path / "prose.txt"
    prose.write_text("Just some prose without headings.\n", encoding="utf-8")
    with pytest.raises(InputError, match="no WikiText heading"):
        load_corpus(cfg("wikitext", str(prose)), {})
    latin1 = tmp_path / "latin1.raw"
    latin1.write_bytes(WIKI.encode() + b"\xe9\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_corpus(cfg("wikitext", str(latin1)), {})
    with pytest.raises(InputError, match="not found"):
        load_corpus(cfg("wikitext", str(tmp_path / "absent.raw")), {})


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail, instead of hanging the suite, when the block blocks (a FIFO opened plainly waits forever)."""
    def stop(*_: object) -> None:
        raise RuntimeError(f"blocked for {seconds} s")  # not an OSError, which readers may catch

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_corpus_path_that_is_a_device_fifo_folder_or_too_large_is_one_named_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from int8alibi.inputs import corpus as corpus_module

    fifo = tmp_path / "wiki.fifo"
    os.mkfifo(fifo)
    for path, why in (("/dev/zero", "a device"), (str(fifo), "a FIFO"), (str(tmp_path), "a folder")):
        with within(10), pytest.raises(InputError, match=rf"^{path}: not a regular file \({why}"):
            load_corpus(cfg("wikitext", path), {})  # /dev/zero was read until memory ran out
    raw = tmp_path / "wiki.test.raw"
    raw.write_text(WIKI, encoding="utf-8")
    monkeypatch.setattr(corpus_module, "MAX_CORPUS_BYTES", len(WIKI.encode()) - 1)
    with pytest.raises(InputError, match=rf"^{raw}: more than {len(WIKI.encode()) - 1:,} bytes"):
        load_corpus(cfg("wikitext", str(raw)), {})
    monkeypatch.setattr(corpus_module, "MAX_CORPUS_BYTES", len(WIKI.encode()))
    assert load_corpus(cfg("wikitext", str(raw)), {}).text == WIKI


def test_synthetic_corpus_is_seeded() -> None:
    a, b = load_corpus(cfg("synthetic")), load_corpus(cfg("synthetic"))
    assert a == b and a.text == synthetic_text()
    assert synthetic_text(seed=1) != a.text
    assert a.pin.startswith("not applicable")


def test_windows_are_consecutive_from_token_zero_with_exact_boundaries() -> None:
    ids = torch.arange(100, 100 + 3 * 8 + 5)
    cut = windows(ids, window=8, count=3)
    assert cut.dtype == torch.int64 and cut.shape == (3, 8)
    assert torch.equal(cut.reshape(-1), ids[:24])              # trailing 5 tokens dropped
    assert torch.equal(windows(ids[:24], 8, 3), cut)            # exactly enough: accepted
    with pytest.raises(InputError, match="23 tokens give 2 complete windows of 8, but 3"):
        windows(ids[:23], 8, 3, source="corpus x")              # one short: refused
    with pytest.raises(InputError, match="window must be"):
        windows(ids, 1, 3)


def test_prompts_follow_the_protocol_list_in_order() -> None:
    analysis = {"prompts": ["a bb ccc", "dddd", "ee"]}
    assert prompt_texts(analysis, 2) == ["a bb ccc", "dddd"]
    ids = prompts(WordTokenizer(), analysis, 3)
    assert ids == [[1, 11, 12, 13], [1, 14], [1, 12]]
    assert prompt_digest(ids) != prompt_digest(ids[:2])
    assert prompt_digest(ids) == prompt_digest([list(p) for p in ids])
    with pytest.raises(ProtocolError, match="asks for 4 prompts"):
        prompt_texts(analysis, 4)
