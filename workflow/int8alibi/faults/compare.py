"""Bitwise comparison facts of many bf16 outputs against a reference, as the campaign's cells need them.

For two bf16 values (as sign-extended int32 bits) the facts are: do the bits differ; is either
value non-finite (all exponent bits set); the ulp distance on the line of representable values
(``arith.bf16``), -1 where either is non-finite. ``whole`` reduces them over every
element of each (output, regime). On a GPU
``whole`` is one Triton pass (``compare_triton``) instead of about twenty tensor passes.
"""

from __future__ import annotations

import torch

from ..arith.bf16 import nonfinite_bits, ordered_line, signed_bits
# Columns of ``whole``: differing elements, largest finite distance (-1: none), positions where
# either is non-finite, positions where exactly one is, non-finite elements of the output itself.
DIFFERING, MAX_DISTANCE, EITHER_NONFINITE, MISMATCH, OWN_NONFINITE = range(5)


def facts(ia: torch.Tensor, ib: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per element: (differ, nonfinite a, nonfinite b, distance), from int32 bits of broadcastable shapes."""
    nfa, nfb = nonfinite_bits(ia), nonfinite_bits(ib)
    distance = torch.where(nfa | nfb, -1, (ordered_line(ib) - ordered_line(ia)).abs_())
    return ib != ia, nfa, nfb, distance


def whole(ref: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """``ref`` bf16 [L, R, E] against ``outputs`` bf16 [L, S, R, E] (S outputs per layer and regime):
    int64 [L, S, R, 5] (columns above)."""
    if outputs.is_cuda:
        from .compare_triton import whole_triton

        return whole_triton(ref, outputs)
    return whole_torch(ref, outputs)


def whole_torch(ref: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """``whole`` in tensor operations (any device)."""
    differ, nfa, nfb, distance = facts(signed_bits(ref)[:, None], signed_bits(outputs))
    either = nfa | nfb
    return torch.stack([differ.sum(-1), distance.amax(-1).to(torch.int64), either.sum(-1),
                        (nfa ^ nfb).sum(-1), nfb.sum(-1)], -1)
