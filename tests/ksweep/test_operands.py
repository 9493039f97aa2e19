"""Seeded sweep operands: one draw per seed, nested K prefixes, per-row scales, both formats' bounds."""

from __future__ import annotations

import pytest
import torch
from int8alibi.errors import InputError
from int8alibi.ksweep.operands import E4M3_MAX, FP8, draw, quantize


def test_the_draw_is_seeded_and_k_takes_a_prefix() -> None:
    d1, d2 = draw(3, 8, 16, 64), draw(3, 8, 16, 64)
    assert torch.equal(d1.x, d2.x) and torch.equal(d1.w, d2.w) and d1.digest() == d2.digest()
    assert d1.digest() != draw(4, 8, 16, 64).digest()
    q = quantize(d1, 32, "int8", "cpu")
    assert q.a_q.shape == (8, 32) and q.w_q.shape == (16, 32)
    assert torch.equal(q.s_a, d1.x[:, :32].abs().amax(dim=1) / 127)


def test_int8_rule_reaches_127_and_stays_symmetric() -> None:
    q = quantize(draw(0, 16, 32, 128), 128, "int8", "cpu")
    assert q.a_q.dtype == torch.int8 and q.a_q.abs().amax(dim=1).eq(127).all()
    assert q.w_q.abs().amax(dim=1).eq(127).all() and int(q.w_q.min()) >= -127
    # dequantized values are within half a step of the draw
    x = draw(0, 16, 32, 128).x
    assert ((q.a_q.float() * q.s_a[:, None] - x).abs() <= q.s_a[:, None] / 2 * (1 + 1e-6)).all()


def test_fp8_rule_maps_each_row_maximum_to_448() -> None:
    d = draw(1, 16, 32, 128)
    q = quantize(d, 64, "fp8", "cpu")
    assert q.a_q.dtype == FP8 and q.w_q.dtype == FP8
    assert q.a_q.float().abs().amax(dim=1).eq(E4M3_MAX).all()
    assert torch.isfinite(q.w_q.float()).all()


def test_an_all_zero_row_gets_scale_zero() -> None:
    d = draw(2, 4, 16, 32)
    d.x[1] = 0
    for fmt in ("int8", "fp8"):
        q = quantize(d, 32, fmt, "cpu")
        assert float(q.s_a[1]) == 0 and not q.a_q[1].float().any()


def test_rows_have_unequal_magnitudes() -> None:
    """The registered per-row factor 2**randint(-2, 3) spreads row maxima over powers of two."""
    d = draw(0, 256, 16, 64)
    ratio = d.x.abs().amax(dim=1).max() / d.x.abs().amax(dim=1).min()
    assert ratio > 8


def test_bad_requests_fail() -> None:
    d = draw(0, 2, 16, 32)
    with pytest.raises(InputError, match="K=64"):
        quantize(d, 64, "int8", "cpu")
    with pytest.raises(InputError, match="unknown format"):
        quantize(d, 16, "fp16", "cpu")
    with pytest.raises(InputError, match="positive"):
        draw(0, 0, 16, 32)
