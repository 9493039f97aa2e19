"""The float32-versus-bf16 division statistics, on hand-worked boundary values and against
llm-compressor's own bytes."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from int8alibi.errors import InputError
from int8alibi.quant import weight as wq
from int8alibi.quant.compressed_tensors import load_checkpoint
from int8alibi.quant.division import division_stats

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llmcompressor"


def _row(values: list[float]) -> torch.Tensor:
    w = torch.tensor([values], dtype=torch.float32).to(torch.bfloat16)
    assert w.float().tolist() == [values]  # every value is exact in bf16
    return w


def _scale(value: float) -> torch.Tensor:
    return torch.tensor([[value]], dtype=torch.bfloat16)


def test_exact_ties_at_one_half_round_to_even_under_both_divisions():
    # 7.5 / 3 = 2.5 and 10.5 / 3 = 3.5 exactly (bf16 and float32 alike): both round to the even 2 and 4.
    w = _row([7.5, 10.5, -7.5])
    assert wq.quantize_with_scale(w, _scale(3.0), "bf16").tolist() == [[2, 4, -2]]
    stats = division_stats(w, _scale(3.0))
    assert stats.differing == 0 and stats.quotient_shift_max == 0.0 and stats.code_offset_max == 0.5


def test_quotients_exactly_at_plus_and_minus_127_5():
    # 255 / 2 = 127.5 is clamped to 127; -127.5 rounds to the even -128 (the asymmetric range).
    w = _row([255.0, -255.0])
    assert wq.quantize_with_scale(w, _scale(2.0), "bf16").tolist() == [[127, -128]]
    assert wq.quantize_with_scale(w, _scale(2.0), "float32").tolist() == [[127, -128]]
    stats = division_stats(w, _scale(2.0))
    # distances from the clamped float32 quotients 127 and -127.5
    assert stats.differing == 0 and stats.quotient_shift_max == 0.0 and stats.code_offset_max == 0.5


def test_a_weight_whose_bf16_quotient_rounds_to_a_tie():
    # 302 / 3 = 100.666...: float32 keeps 100.66666 (-> 101); bf16's spacing at 100 is 0.5, so the
    # bf16 quotient is 100.5, a tie that rounds to the even 100. One int8 weight differs.
    w = _row([302.0, 7.5])
    s = _scale(3.0)
    assert wq.quantize_with_scale(w, s, "bf16").tolist() == [[100, 2]]
    assert wq.quantize_with_scale(w, s, "float32").tolist() == [[101, 2]]
    q_f32 = float(np.float32(302.0) / np.float32(3.0))  # IEEE float32 division, correctly rounded
    assert abs(Fraction(q_f32) - Fraction(302, 3)) < Fraction(1, 2**17)
    stats = division_stats(w, s)
    assert stats.differing == 1
    assert stats.quotient_shift_max == q_f32 - 100.5
    assert stats.code_offset_max == q_f32 - 100.0


def test_statistics_agree_with_the_two_quantizations_and_their_bounds():
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(256, 512, generator=gen) * 0.02).to(torch.bfloat16)
    bf16, f32 = wq.quantize_weight(w, "bf16"), wq.quantize_weight(w, "float32")
    stats = division_stats(w, bf16.s_w)
    assert stats.differing == int((bf16.w_q != f32.w_q).sum()) > 0
    assert 0.0 < stats.quotient_shift_max <= 0.25  # half of bf16's spacing below 128
    assert 0.5 < stats.code_offset_max < 0.75


def test_float32_division_against_llm_compressors_own_int8():
    """The differing count, taken against the bytes llm-compressor wrote rather than our bf16 rebuild."""
    parent = load_file(str(FIXTURE / "parent" / "model.safetensors"))
    ckpt = load_checkpoint(FIXTURE / "quantized")
    differing = total = 0
    for layer in ckpt.layers:
        stored, w = ckpt[layer], parent[f"{layer}.weight"]
        stats = division_stats(w, stored.s_w, what=layer)
        assert stats.differing == int((wq.quantize_with_scale(w, stored.s_w, "float32") != stored.w_q).sum())
        differing, total = differing + stats.differing, total + w.numel()
    assert 0.05 < differing / total < 0.15


def test_bad_input_names_the_layer():
    with pytest.raises(InputError, match="layer.x"):
        division_stats(torch.zeros(2, 2), _scale(1.0), what="layer.x")
