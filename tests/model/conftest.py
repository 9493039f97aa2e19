"""Shared fixtures for the model tests: a tiny seeded Qwen3 (small vocabulary, no tokenizer needed),
an exact CUTLASS-order arm written here independently of int8alibi.kernels, and English prose."""

from __future__ import annotations

import pytest
import torch

from int8alibi.model.synthetic import build_synthetic

TINY_VOCAB = 256


class CutlassOrderReference:
    """Exact int64 accumulator, float32 epilogue ``s_a * (s_w * f32(acc))``, one RNE cast to bf16.

    A test-local restatement of the CUTLASS epilogue, so the W8A8 path is checked against
    arithmetic that does not come from the module under test.
    """

    name = "test-cutlass-order"
    is_emulation = True

    def scaled_mm(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
        acc = a_q.to(torch.int64) @ w_q.to(torch.int64).T
        return (s_a[:, None] * (s_w[None, :] * acc.to(torch.float32))).to(torch.bfloat16)


@pytest.fixture
def tiny_model() -> torch.nn.Module:
    return build_synthetic("tiny", seed=0, vocab_size=TINY_VOCAB)


@pytest.fixture
def reference_arm() -> CutlassOrderReference:
    return CutlassOrderReference()


@pytest.fixture
def english_prose() -> str:
    """English prose that ships with CPython: the start of the pipeline's embedded corpus
    (CPython 3.11.7's ``pydoc_data.topics``, shipped as a file), enough for 512 tokens."""
    from int8alibi.inputs.corpus import package_text

    return package_text()[:8000]
