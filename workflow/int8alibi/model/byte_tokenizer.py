"""A byte tokenizer for the paper-scale synthetic parents: token id = UTF-8 byte, no data file.

Built in code (a byte-level BPE with the 256 byte symbols and no merges), so it is the same
everywhere and needs no download or GGUF package; transformers saves and reloads it like any fast
tokenizer (``tokenizer.json``). Any text encodes to its UTF-8 bytes and decodes back exactly. The
model's vocabulary may be larger (Qwen3's 151936): ids 256 and up are then never produced by it.
"""

from __future__ import annotations

from typing import Any

BYTES = 256


def byte_symbols() -> list[str]:
    """The printable character standing for each byte 0..255 in byte-level BPE vocabularies:
    printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    keep = set(printable)
    extra = iter(range(BYTES, 2 * BYTES))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(BYTES)]


def byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` whose ids are the UTF-8 bytes of the text (no special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: byte for byte, symbol in enumerate(byte_symbols())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)
