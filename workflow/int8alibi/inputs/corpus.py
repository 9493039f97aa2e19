"""The pinned text inputs: the perplexity corpus, its window cut, and the generation prompts.

Perplexity and determinism are only comparable across runs if every run scores the same tokens,
so the corpus is identified by the SHA-256 of its text (the embedded one is pinned in the
protocol), and windows and prompts follow the protocol's selection rules
(``preregistration/analysis.yaml``: ``selection``), never a choice made here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..errors import InputError, ProtocolError
from ..files.hashing import canonical_json, open_regular, sha256_bytes

ANALYSIS_FILE = "preregistration/analysis.yaml"
PACKAGE_SOURCE = "int8alibi/data/pydoc-topics-3.11.7.txt"
PACKAGE_FILE = Path(__file__).resolve().parents[1] / "data" / "pydoc-topics-3.11.7.txt"

# The largest corpus file read: WikiText-103's raw training split is about 540 MB.
MAX_CORPUS_BYTES = 1 << 30

SYNTHETIC_SEED = 0
SYNTHETIC_WORDS = 20_000
# A fixed vocabulary of plain English words, so a synthetic corpus tokenizes like prose.
_SYNTHETIC_VOCAB = (
    "the of and to in is that it was for on are as with by this be at from or an have not which "
    "one all were there can more when some time into only other new may these two first any "
    "could over water after most people way made many where long day through make years "
    "good well number part world down work just place small large kernel scale weight token "
    "model output integer float round table window prompt layer exact order"
).split()

# WikiText headings look like " = Title = " (level 1) or " = = Section = = " (deeper levels).
_WIKITEXT_HEADING = re.compile(r"^ (= )+[^=\n].*?( =)+ ?$", re.MULTILINE)


@dataclass(frozen=True)
class CorpusText:
    """One corpus: its name, text and the SHA-256 of its UTF-8 bytes.

    ``pin`` says how the digest was checked: ``"protocol"`` when it equals the protocol's pin,
    otherwise why no pin applies (a local WikiText file the protocol does not pin, a test corpus).
    """

    name: str
    text: str
    sha256: str
    pin: str


def text_digest(text: str) -> str:
    """SHA-256 of a text's UTF-8 bytes: the corpus identity recorded everywhere."""
    return sha256_bytes(text.encode("utf-8"))


def _analysis(analysis: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if analysis is not None:
        return analysis
    from ..protocol import load

    return load().analysis


def _corpus_pins(analysis: Mapping[str, Any]) -> Mapping[str, Any]:
    pins = analysis.get("corpus")
    return pins if isinstance(pins, Mapping) else {}


def package_text() -> str:
    """The embedded corpus: CPython 3.11.7's ``pydoc_data.topics`` (English prose: the language
    reference topics, sorted keys, joined by blank lines), shipped with this package under the
    PSF licence beside it, so the text does not depend on the interpreter a machine has."""
    try:
        return PACKAGE_FILE.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{PACKAGE_FILE}: the embedded corpus file is missing from the installed package") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{PACKAGE_FILE}: the embedded corpus cannot be read as UTF-8 ({exc})") from exc


def _load_package(analysis: Mapping[str, Any]) -> CorpusText:
    name = f"package:{PACKAGE_SOURCE}"
    pin = _corpus_pins(analysis).get("package")
    if not isinstance(pin, Mapping) or not isinstance(pin.get("sha256"), str):
        raise ProtocolError(f"{ANALYSIS_FILE}: no corpus.package.sha256 pin, so the embedded corpus "
                            f"({PACKAGE_SOURCE}) cannot be verified; the protocol must pin its digest")
    if pin.get("source") != PACKAGE_SOURCE:
        raise ProtocolError(f"{ANALYSIS_FILE}: corpus.package.source is {pin.get('source')!r}, "
                            f"but the embedded corpus is {PACKAGE_SOURCE!r}")
    text = package_text()
    digest = text_digest(text)
    if digest != pin["sha256"]:
        raise InputError(f"corpus {name}: sha256 {digest} differs from the protocol's pin "
                         f"{pin['sha256']} ({ANALYSIS_FILE}: corpus.package.sha256); the file {PACKAGE_FILE} "
                         f"is not the text the protocol was registered with")
    return CorpusText(name=name, text=text, sha256=digest, pin="protocol")


def check_wikitext(text: str, source: str) -> None:
    """Fail unless ``text`` looks like raw WikiText: section headings present, no ``<unk>``.

    The tokenized (non-raw) release replaces rare words with ``<unk>``; scoring it would measure
    a different text under the same name.
    """
    if not text.strip():
        raise InputError(f"{source}: WikiText corpus is empty")
    if _WIKITEXT_HEADING.search(text) is None:
        raise InputError(f"{source}: no WikiText heading line (' = Title = ') found; "
                         f"not a WikiText raw file")
    if "<unk>" in text:
        raise InputError(f"{source}: contains '<unk>': this is the tokenized WikiText release, "
                         f"not the raw one (wiki.*.raw)")


def _load_wikitext(path_value: str | None, analysis: Mapping[str, Any]) -> CorpusText:
    if not path_value:
        raise InputError("config corpus.path: required when corpus.source is wikitext")
    path = Path(path_value)
    if not os.path.exists(path):  # any error of stat counts as absent: a line, never a traceback
        raise InputError(f"{path}: WikiText file not found (config corpus.path)")
    # a regular file only (a device such as /dev/zero never ends, a FIFO blocks), and of a corpus's size
    with open_regular(path) as handle:
        try:
            data = handle.read(MAX_CORPUS_BYTES + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if len(data) > MAX_CORPUS_BYTES:
        raise InputError(f"{path}: more than {MAX_CORPUS_BYTES:,} bytes; a WikiText corpus is text of at most "
                         "a few hundred MB (config corpus.path)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc})") from None
    check_wikitext(text, str(path))
    digest = text_digest(text)
    pin = _corpus_pins(analysis).get("wikitext")
    if isinstance(pin, Mapping) and isinstance(pin.get("sha256"), str):
        if digest != pin["sha256"]:
            raise InputError(f"corpus {path}: sha256 {digest} differs from the protocol's pin "
                             f"{pin['sha256']} ({ANALYSIS_FILE}: corpus.wikitext.sha256)")
        return CorpusText(name=f"wikitext:{path.name}", text=text, sha256=digest, pin="protocol")
    return CorpusText(name=f"wikitext:{path.name}", text=text, sha256=digest,
                      pin="not pinned by the protocol: digest recorded only")


def synthetic_text(seed: int = SYNTHETIC_SEED, words: int = SYNTHETIC_WORDS) -> str:
    """Seeded word salad from a fixed English vocabulary, for tests of the pipeline's plumbing."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(_SYNTHETIC_VOCAB), (words,), generator=gen).tolist()
    tokens = [_SYNTHETIC_VOCAB[i] for i in picks]
    sentences = [" ".join(tokens[i:i + 12]) + "." for i in range(0, len(tokens), 12)]
    return "\n".join(" ".join(sentences[i:i + 5]) for i in range(0, len(sentences), 5)) + "\n"


def load_corpus(cfg: Config, analysis: Mapping[str, Any] | None = None) -> CorpusText:
    """The corpus the config names, verified against the protocol (``analysis``: its analysis
    rules; loaded from ``preregistration/`` when not given)."""
    spec = cfg["corpus"]
    source = spec["source"]
    if source == "package":
        return _load_package(_analysis(analysis))
    if source == "wikitext":
        return _load_wikitext(spec.get("path"), _analysis(analysis))
    if source == "synthetic":
        text = synthetic_text()
        return CorpusText(name=f"synthetic:seed={SYNTHETIC_SEED}", text=text, sha256=text_digest(text),
                          pin=f"not applicable: synthetic test corpus (seed {SYNTHETIC_SEED})")
    raise InputError(f"config corpus.source: unknown source {source!r} (package, wikitext, synthetic)")


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` under the protocol's rule: the model's tokenizer, no chat template,
    special tokens as the tokenizer adds them by default."""
    ids = tokenizer(text)["input_ids"]
    return [int(i) for i in ids]


def windows(token_ids: Sequence[int] | torch.Tensor, window: int, count: int,
            source: str = "corpus") -> torch.Tensor:
    """The first ``count`` consecutive non-overlapping windows of ``window`` tokens, from token 0.

    A trailing partial window is dropped; fewer complete windows than ``count`` is an error,
    never a silent shortfall. Returns int64 ``[count, window]``.
    """
    if window < 2 or count < 1:
        raise InputError(f"{source}: window must be >= 2 tokens and count >= 1 (got {window}, {count})")
    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    complete = ids.numel() // window
    if complete < count:
        raise InputError(f"{source}: {ids.numel()} tokens give {complete} complete windows of "
                         f"{window}, but {count} are required")
    return ids[: count * window].reshape(count, window).clone()


def prompt_texts(analysis: Mapping[str, Any], count: int) -> list[str]:
    """The first ``count`` prompts of the protocol's list, in order."""
    listed = analysis.get("prompts")
    if not isinstance(listed, list) or not all(isinstance(p, str) and p for p in listed):
        raise ProtocolError(f"{ANALYSIS_FILE}: prompts must be a list of non-empty strings")
    if count < 1 or count > len(listed):
        raise ProtocolError(f"{ANALYSIS_FILE}: the size profile asks for {count} prompts, "
                            f"the protocol lists {len(listed)}")
    return list(listed[:count])


def prompts(tokenizer: Any, analysis: Mapping[str, Any], count: int) -> list[list[int]]:
    """Token ids of the first ``count`` protocol prompts (each its own sequence, unpadded)."""
    out = [encode(tokenizer, text) for text in prompt_texts(analysis, count)]
    empty = [i for i, ids in enumerate(out) if not ids]
    if empty:
        raise InputError(f"prompt {empty[0]}: the tokenizer returned no tokens")
    return out


def prompt_digest(prompt_ids: Sequence[Sequence[int]]) -> str:
    """Digest of the prompt token lists, in order: the identity contract's prompt-list digest."""
    return sha256_bytes(canonical_json([[int(t) for t in p] for p in prompt_ids]).encode())

