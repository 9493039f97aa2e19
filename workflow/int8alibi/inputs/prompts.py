"""Capture's pinned token inputs: the prefill tile and the decode prompt, by the protocol's rules.

``preregistration/analysis.yaml`` fixes them before data (``selection.capture_prefill`` and
``selection.capture_decode``): the prefill tile is the first ``prefill_tokens`` tokens of the
corpus tokenized as one stream; the decode capture is the first generated step (M = 1) after
prefilling the first protocol prompt. Each selection carries the SHA-256 of its token ids so the
index and manifest say exactly which tokens the operands came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .corpus import ANALYSIS_FILE, CorpusText, encode, prompts
from ..errors import InputError, ProtocolError
from ..files.hashing import canonical_json, sha256_bytes

DECODE_ROWS = 1  # a decode step feeds one token: the only decode tile the capture defines


@dataclass(frozen=True)
class CaptureSizes:
    """The size profile's capture sizes: prefill rows M and decode rows (always 1)."""

    profile: str
    prefill_tokens: int
    decode_tokens: int


@dataclass(frozen=True)
class TokenSelection:
    """Token ids chosen by a protocol rule, where they came from, and their digest."""

    role: str
    token_ids: torch.Tensor  # int64 [T]
    sha256: str
    source: str
    rule: str


def token_digest(ids: torch.Tensor) -> str:
    """SHA-256 of the canonical JSON list of the token ids (the same on every platform)."""
    return sha256_bytes(canonical_json([int(i) for i in ids.reshape(-1).tolist()]).encode())


def capture_sizes(analysis: Mapping[str, Any], profile: str) -> CaptureSizes:
    """The capture sizes of size profile ``profile``; a decode tile other than one row is refused."""
    profiles = analysis.get("size_profiles", {})
    if profile not in profiles:
        raise ProtocolError(f"{ANALYSIS_FILE}: no size profile {profile!r} (defined: {sorted(profiles)})")
    spec = profiles[profile]
    prefill, decode = int(spec["prefill_tokens"]), int(spec["decode_tokens"])
    if prefill < 1:
        raise ProtocolError(f"{ANALYSIS_FILE}: size profile {profile!r} has prefill_tokens={prefill}")
    if decode != DECODE_ROWS:
        raise ProtocolError(f"{ANALYSIS_FILE}: size profile {profile!r} has decode_tokens={decode}; "
                            f"a decode step captures M = {DECODE_ROWS} row")
    return CaptureSizes(profile=profile, prefill_tokens=prefill, decode_tokens=decode)


def _rule(analysis: Mapping[str, Any], key: str) -> str:
    text = analysis.get("selection", {}).get(key)
    if not isinstance(text, str) or not text.strip():
        raise ProtocolError(f"{ANALYSIS_FILE}: selection.{key} (the capture selection rule) is missing")
    return " ".join(text.split())


def prefill_tile(tokenizer: Any, corpus: CorpusText, tokens: int, analysis: Mapping[str, Any]) -> TokenSelection:
    """The first ``tokens`` tokens of the corpus tokenized as one stream; a shorter corpus is an error."""
    ids = torch.tensor(encode(tokenizer, corpus.text), dtype=torch.int64)
    if ids.numel() < tokens:
        raise InputError(f"corpus {corpus.name}: {ids.numel()} tokens, but the prefill tile needs {tokens}")
    tile = ids[:tokens].clone()
    return TokenSelection(role="prefill", token_ids=tile, sha256=token_digest(tile),
                          source=f"{corpus.name} (sha256 {corpus.sha256}), tokens 0..{tokens - 1}",
                          rule=_rule(analysis, "capture_prefill"))


def decode_prompt(tokenizer: Any, analysis: Mapping[str, Any]) -> TokenSelection:
    """The first protocol prompt's token ids, prefilled before the captured decode step."""
    ids = torch.tensor(prompts(tokenizer, analysis, 1)[0], dtype=torch.int64)
    return TokenSelection(role="decode-prompt", token_ids=ids, sha256=token_digest(ids),
                          source=f"{ANALYSIS_FILE}: prompts[0]", rule=_rule(analysis, "capture_decode"))
