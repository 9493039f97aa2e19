"""llm-compressor's W8A8 weight rule: the asymmetric -128, zero rows, the exact bf16 division,
the float32 alternative, power-of-two arms and the rewritten probe."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import bf16_round, is_pow2
from int8alibi.errors import InputError
from int8alibi.quant import weight as wq


def _bf16(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).to(torch.bfloat16)


def _random(n: int = 96, k: int = 160, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)


def test_negative_largest_weight_quantizes_to_minus_128_positive_to_127():
    m = 0.99609375  # 255/256: absmax / 127.5 is exactly 2^-7, so the quotient of absmax is exactly 127.5
    w = _bf16([[0.5, -m, 0.25, 0.0], [m, -0.5, 0.25, 0.0], [m, -m, 0.5, -0.5]])
    w_q, s_w = wq.quantize_weight(w)
    assert s_w.dtype == torch.bfloat16 and tuple(s_w.shape) == (3, 1) and bool((s_w == 2.0**-7).all())
    q = wq.quotient(w, s_w, "bf16")
    assert q[0, 1].item() == -127.5 and q[1, 0].item() == 127.5
    # -127.5 rounds to the even -128; +127.5 is clamped to 127 first.
    assert w_q[0, 1].item() == -128 and w_q[0].max().item() < 127
    assert w_q[1, 0].item() == 127 and w_q[1].min().item() > -128
    assert w_q[2, 0].item() == 127 and w_q[2, 1].item() == -128


def test_negative_largest_weight_stays_at_minus_127_when_the_scale_rounded_up():
    # absmax 1.0: bf16(1/127.5) rounds up by 0.39%, the quotient is 127.007 -> bf16 127 -> -127.
    w_q, s_w = wq.quantize_weight(_bf16([[0.5, -1.0, 0.25, 0.0]]))
    assert s_w.item() > 1 / 127.5 and w_q[0, 1].item() == -127


def test_most_rows_with_a_negative_largest_weight_reach_minus_128():
    w = _random(1024, 256, seed=9)
    w_q, _ = wq.quantize_weight(w)
    absmax = w.float().abs().amax(dim=1)
    negative_max = w.float().amin(dim=1) == -absmax  # some negative weight has the largest magnitude
    reached = (w_q == -128).any(dim=1)
    assert not bool(reached[~negative_max].any())  # only such rows can reach -128
    assert reached[negative_max].float().mean().item() > 0.5
    assert int(w_q.max()) == 127


def test_scale_is_bf16_of_absmax_over_127_5_computed_exactly():
    w = _random()
    s_w = wq.channel_scale(w)
    exact = w.double().abs().amax(dim=1, keepdim=True) / 127.5  # exact enough: one rounding from float64
    assert torch.equal(s_w.view(torch.int16), bf16_round(exact, "rne").view(torch.int16))


def test_zero_row_gets_bf16_epsilon_scale_and_zero_codes():
    w = _random(4, 32)
    w[2] = 0
    w_q, s_w = wq.quantize_weight(w)
    assert s_w[2, 0].item() == 2.0**-7 == torch.finfo(torch.bfloat16).eps
    assert not w_q[2].any()


def test_bf16_division_is_the_correctly_rounded_quotient_and_torch_bf16_division():
    w = _random(256, 256, seed=1)
    s_w = wq.channel_scale(w)
    ours = wq.quotient(w, s_w, "bf16")
    # One rounding of the (float64-exact enough) quotient to bf16 is the correctly rounded bf16 quotient.
    single = bf16_round(w.double() / s_w.double(), "rne").float()
    assert torch.equal(ours, single)
    # torch's own bf16 division on CPU (what llm-compressor runs) gives the same values.
    assert torch.equal(ours, (w / s_w).float())


def test_float32_division_moves_about_one_weight_in_ten():
    w = _random(512, 512, seed=2)
    bf16_q, _ = wq.quantize_weight(w, "bf16")
    f32_q, _ = wq.quantize_weight(w, "float32")
    moved = (bf16_q.int() - f32_q.int()).abs()
    assert moved.max().item() == 1
    assert 0.05 < (moved > 0).float().mean().item() < 0.15


def test_round_half_even_on_the_rounded_quotient():
    # Row scale 1/127.5 -> bf16 0.0078430176; w = s * 2.5 style quotients: build them from the scale.
    s = torch.tensor([[2.0**-7]], dtype=torch.bfloat16)
    w = (torch.tensor([[2.5, 3.5, -2.5, -0.5, 0.5, 126.5, 127.0]]) * 2.0**-7).to(torch.bfloat16)
    q = wq.quantize_with_scale(w, s, "bf16")
    assert q[0].tolist() == [2, 4, -2, 0, 0, 126, 127]


def test_clipped_counts_quotients_outside_the_int8_range():
    s = torch.tensor([[2.0**-7], [2.0**-7]], dtype=torch.bfloat16)
    w = (torch.tensor([[127.5, -128.0, 200.0, -300.0], [1.0, 127.0, -128.5, 0.0]]) * 2.0**-7).to(torch.bfloat16)
    # 127.5 is outside [-128, 127] and is clamped; -128.5 is not a bf16 value: w holds -128 * 2^-7.
    assert wq.clipped_per_row(w, s, "bf16").tolist() == [3, 0]
    assert wq.quantize_with_scale(w, s, "bf16")[0].tolist() == [127, -128, 127, -128]


@pytest.mark.parametrize("mode", ["nearest", "ceiling"])
def test_pow2_arms_snap_the_scale_and_recompute_int8(mode):
    w = _random(128, 96, seed=3)
    own_q, own_s = wq.quantize_weight(w)
    q, s = wq.requantize(w, mode)
    assert bool(is_pow2(s).all())
    if mode == "ceiling":
        assert bool((s >= own_s).all())
    assert torch.equal(q, wq.quantize_with_scale(w, s, "bf16"))
    # Dividing by a power of two is exact: both division precisions agree.
    assert torch.equal(q, wq.requantize(w, mode, "float32").w_q)
    assert not torch.equal(q, own_q)


def test_nearest_clips_where_the_scale_went_down_ceiling_never_beyond_the_asymmetric_edge():
    w = _random(256, 128, seed=4)
    _, s_near = wq.requantize(w, "nearest")
    _, s_ceil = wq.requantize(w, "ceiling")
    down = (s_near < wq.channel_scale(w)).flatten()
    clipped_near = wq.clipped_per_row(w, s_near, "bf16")
    assert bool((clipped_near[down] > 0).any())
    # Under the ceiling scale |W/s| <= absmax/s_own <= 127.5-ish: only the +127.5 edge can clip.
    assert wq.clipped_per_row(w, s_ceil, "bf16").max().item() <= 1


def test_rewritten_probe_keeps_old_int8_and_snaps_scales():
    w = _random(64, 64, seed=5)
    own_q, own_s = wq.quantize_weight(w)
    q, s = wq.rewritten_probe(own_q, own_s)
    assert q is own_q and bool(is_pow2(s).all())
    assert torch.equal(s.view(torch.int16), wq.requantize(w, "nearest").s_w.view(torch.int16))


def test_rejections_name_the_weight_and_reason():
    with pytest.raises(InputError, match="blk.q: weight must be a 2-D torch.bfloat16"):
        wq.quantize_weight(torch.zeros(4, 4), what="blk.q")
    bad = _random(4, 4)
    bad[0, 0] = float("nan")
    with pytest.raises(InputError, match="blk.k: weight has 1 non-finite"):
        wq.quantize_weight(bad, what="blk.k")
    with pytest.raises(InputError, match=r"scale must be torch.bfloat16 of shape \[4, 1\]"):
        wq.quantize_with_scale(_random(4, 4), torch.ones(4, dtype=torch.bfloat16), "bf16")
    with pytest.raises(InputError, match="zero, negative or non-finite"):
        wq.quantize_with_scale(_random(4, 4), torch.zeros(4, 1, dtype=torch.bfloat16), "bf16")
    with pytest.raises(InputError, match="division 'f16' unknown"):
        wq.quantize_weight(_random(4, 4), "f16")
    with pytest.raises(InputError, match="mode 'floor' unknown"):
        wq.requantize(_random(4, 4), "floor")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("division", ["bf16", "float32"])
def test_cuda_gives_the_same_bytes_as_cpu(division):
    w = _random(2048, 2048, seed=6)
    w[7] = 0
    cpu = wq.quantize_weight(w, division)
    gpu = wq.quantize_weight(w.cuda(), division)
    assert torch.equal(gpu.w_q.cpu(), cpu.w_q)
    assert torch.equal(gpu.s_w.cpu().view(torch.int16), cpu.s_w.view(torch.int16))
    for mode in ("nearest", "ceiling"):
        assert torch.equal(wq.requantize(w.cuda(), mode, division).w_q.cpu(), wq.requantize(w, mode, division).w_q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_float_to_bf16_cast_is_round_to_nearest_even():
    # The bf16 division relies on torch's float32 -> bf16 cast being RNE on the GPU too.
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(1 << 20, generator=gen) * torch.exp(torch.randn(1 << 20, generator=gen) * 8)
    ties = (torch.arange(1 << 12, dtype=torch.int32) << 16 | 0x8000).view(torch.float32)  # exact bf16 ties
    x = torch.cat([x, ties[torch.isfinite(ties)]])
    assert torch.equal(x.cuda().to(torch.bfloat16).cpu().view(torch.int16), bf16_round(x, "rne").view(torch.int16))
