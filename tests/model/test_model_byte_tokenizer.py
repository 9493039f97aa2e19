"""The byte tokenizer: ids are the UTF-8 bytes, decoding is exact, and it saves and reloads."""

from __future__ import annotations

from transformers import AutoTokenizer

from int8alibi.inputs.corpus import encode
from int8alibi.model.byte_tokenizer import byte_symbols, byte_tokenizer
from int8alibi.model.sources import tokenizer_digest

TEXTS = ["", "a", " leading and trailing ", "The quick brown fox: 12,345 tokens — naïve café.\n",
         "\x00\x01\t\r\n\x7f", "日本語のテキスト 🙂 \U0010ffff", "ÿ¡¬®", "  \n\n  "]


def test_ids_are_utf8_bytes_and_decode_back_exactly():
    tokenizer = byte_tokenizer()
    assert len(tokenizer) == 256
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids == list(text.encode("utf-8")), text
        assert tokenizer.decode(ids) == text
    every_byte = bytes(range(256)).decode("latin-1")
    assert encode(tokenizer, every_byte) == list(every_byte.encode("utf-8"))


def test_symbols_are_256_distinct_printable_characters():
    symbols = byte_symbols()
    assert len(set(symbols)) == 256 and all(s.isprintable() and not s.isspace() for s in symbols)
    assert symbols[ord("A")] == "A" and symbols[ord(" ")] == chr(256 + 32)


def test_save_and_reload_keeps_encoding_and_digest(tmp_path):
    tokenizer = byte_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tokenizer_digest(reloaded) == tokenizer_digest(tokenizer) == tokenizer_digest(byte_tokenizer())
