"""``compare.whole`` as one Triton kernel: each output read once, the reductions done on chip.

Every program compares one block of one (output, regime) row with the reference and writes five
partial results; a sum and a max over the blocks finish them. Integer operations only, so the
interpreter (``TRITON_INTERPRET=1``, tests on CPU) and the GPU compute the same numbers. Import
only where Triton is installed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..arith.bf16 import EXPONENT

BLOCK = 4096


@triton.jit
def _whole_kernel(ref_ptr, out_ptr, part_ptr, E, R, SR, blocks, BLOCK: tl.constexpr, EXPONENT: tl.constexpr):
    row = tl.program_id(0)            # (layer, output, regime), flattened
    block = tl.program_id(1)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    inside = offs < E
    ref_row = (row // SR) * R + row % R
    ia = tl.load(ref_ptr + ref_row.to(tl.int64) * E + offs, mask=inside, other=0).to(tl.int32)
    ib = tl.load(out_ptr + row.to(tl.int64) * E + offs, mask=inside, other=0).to(tl.int32)
    nfa = (ia & EXPONENT) == EXPONENT  # arith.bf16.nonfinite_bits
    nfb = (ib & EXPONENT) == EXPONENT
    either = nfa | nfb
    oa = tl.where(ia < 0, -32768 - ia, ia)  # arith.bf16.ordered_line
    ob = tl.where(ib < 0, -32768 - ib, ib)
    distance = tl.where(either | ~inside, -1, tl.abs(ob - oa))
    differ = (ia != ib) & inside
    base = part_ptr + (row.to(tl.int64) * blocks + block) * 5
    tl.store(base + 0, tl.sum(differ.to(tl.int32), axis=0))
    tl.store(base + 1, tl.max(distance, axis=0))
    tl.store(base + 2, tl.sum((either & inside).to(tl.int32), axis=0))
    tl.store(base + 3, tl.sum(((nfa != nfb) & inside).to(tl.int32), axis=0))
    tl.store(base + 4, tl.sum((nfb & inside).to(tl.int32), axis=0))


def whole_triton(ref: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """``ref`` bf16 [L, R, E] against ``outputs`` bf16 [L, S, R, E]: int64 [L, S, R, 5] (``compare``
    columns)."""
    layers, s, r, e = outputs.shape
    blocks = triton.cdiv(e, BLOCK)
    parts = torch.empty((layers * s * r, blocks, 5), dtype=torch.int32, device=outputs.device)
    _whole_kernel[(layers * s * r, blocks)](ref.contiguous().view(torch.int16), outputs.contiguous().view(torch.int16),
                                            parts, e, r, s * r, blocks, BLOCK=BLOCK, EXPONENT=EXPONENT)
    sums = parts.to(torch.int64).sum(1)
    sums[:, 1] = parts[:, :, 1].amax(1)
    return sums.reshape(layers, s, r, 5)
