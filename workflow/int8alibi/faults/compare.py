"""Bitwise comparison facts of many bf16 outputs against a reference, as the campaign's cells need them.

For two bf16 values (as sign-extended int32 bits) the facts are: do the bits differ; is either
value non-finite (all exponent bits set); the ulp distance on the line of representable values
(``checks.ordered_positions``), -1 where either is non-finite. ``whole`` reduces them over every
element of each (output, regime). On a GPU
``whole`` is one Triton pass (``compare_triton``) instead of about twenty tensor passes.
"""

from __future__ import annotations

import torch

BF16_EXPONENT = 0x7F80
# Columns of ``whole``: differing elements, largest finite distance (-1: none), positions where
# either is non-finite, positions where exactly one is, non-finite elements of the output itself.
DIFFERING, MAX_DISTANCE, EITHER_NONFINITE, MISMATCH, OWN_NONFINITE = range(5)


def ordered(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bits (sign-extended int32) on the line of representable values, +0 and -0 at 0."""
    return torch.where(bits < 0, -32768 - bits, bits)


def facts(ia: torch.Tensor, ib: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per element: (differ, nonfinite a, nonfinite b, distance), from int32 bits of broadcastable shapes."""
    nfa = (ia & BF16_EXPONENT) == BF16_EXPONENT
    nfb = (ib & BF16_EXPONENT) == BF16_EXPONENT
    distance = torch.where(nfa | nfb, -1, (ordered(ib) - ordered(ia)).abs_())
    return ib != ia, nfa, nfb, distance


def bits32(y: torch.Tensor) -> torch.Tensor:
    """bf16 values as sign-extended int32 bit patterns."""
    return y.view(torch.int16).to(torch.int32)


def whole(ref: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """``ref`` bf16 [L, R, E] against ``outputs`` bf16 [L, S, R, E] (S outputs per layer and regime):
    int64 [L, S, R, 5] (columns above)."""
    if outputs.is_cuda:
        from .compare_triton import whole_triton

        return whole_triton(ref, outputs)
    return whole_torch(ref, outputs)


def whole_torch(ref: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """``whole`` in tensor operations (any device)."""
    differ, nfa, nfb, distance = facts(bits32(ref)[:, None], bits32(outputs))
    either = nfa | nfb
    return torch.stack([differ.sum(-1), distance.amax(-1).to(torch.int64), either.sum(-1),
                        (nfa ^ nfb).sum(-1), nfb.sum(-1)], -1)
