"""The largest code offset is measured from the clamped float32 quotient: a weight far outside the
int8 range is clamped to -128 or 127 by both divisions and is then no offset at all."""

from __future__ import annotations

import torch

from int8alibi.quant import weight as wq
from int8alibi.quant.division import division_stats


def test_clamped_quotients_offset_nothing_and_the_tie_decides() -> None:
    # 300 / 2 = 150 and -300 / 2 = -150 clamp to 127 and -128 (codes equal to the clamped quotients);
    # 5 / 2 = 2.5 is a tie that rounds to the even 2: an offset of exactly 0.5 is the largest.
    w = torch.tensor([[300.0, -300.0, 5.0]]).to(torch.bfloat16)
    s = torch.tensor([[2.0]], dtype=torch.bfloat16)
    assert wq.quantize_with_scale(w, s, "float32").tolist() == [[127, -128, 2]]
    stats = division_stats(w, s)
    assert stats.differing == 0 and stats.quotient_shift_max == 0.0
    assert stats.code_offset_max == 0.5


def test_just_outside_the_range_each_side() -> None:
    # 256 / 2 = 128 -> 127 (offset 0 from the clamp at 127); -258 / 2 = -129 -> -128 (0);
    # 3 / 2 = 1.5 -> 2 (to even): 0.5 again; 1 / 2 = 0.5 -> 0 (to even): 0.5.
    w = torch.tensor([[256.0, -258.0, 3.0, 1.0]]).to(torch.bfloat16)
    assert w.float().tolist() == [[256.0, -258.0, 3.0, 1.0]]
    stats = division_stats(w, torch.tensor([[2.0]], dtype=torch.bfloat16))
    assert stats.code_offset_max == 0.5
