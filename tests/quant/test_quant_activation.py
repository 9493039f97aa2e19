"""vLLM's dynamic per-token int8 rule: boundary values, ties, saturation, an independent numpy check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.quant.activation import quantize_per_token


def _numpy_reference(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's float32 steps in numpy (IEEE float32 ops, rint = round half to even)."""
    xf = x.float().numpy().astype(np.float32)
    absmax = np.abs(xf).max(axis=1)
    with np.errstate(divide="ignore"):
        inverse = np.where(absmax == 0, np.float32(0), np.float32(127) / absmax).astype(np.float32)
    scale = (absmax / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint((xf * inverse[:, None]).astype(np.float32)), -128, 127).astype(np.int8)
    return q, scale


def test_zero_row_has_zero_scale_and_zero_codes():
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    x[1, 3] = -0.5
    a_q, s_a = quantize_per_token(x)
    assert s_a[0].item() == 0.0 and not a_q[0].any()
    assert a_q[1, 3].item() == -127 and s_a[1].item() == np.float32(0.5) / np.float32(127)


def test_absmax_element_maps_to_plus_minus_127():
    x = torch.tensor([[3.0, -7.0, 1.0, 0.0], [0.25, 0.5, -0.125, 0.5]], dtype=torch.bfloat16)
    a_q, _ = quantize_per_token(x)
    assert a_q[0, 1].item() == -127 and a_q[1, 1].item() == 127 and a_q[1, 3].item() == 127


def test_exact_halves_round_to_even():
    # absmax 127 makes the inverse scale exactly 1, so x itself is the value that gets rounded.
    x = torch.tensor([[127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.5, 126.5]], dtype=torch.bfloat16)
    a_q, s_a = quantize_per_token(x)
    assert s_a.item() == 1.0
    assert a_q[0].tolist() == [127, 2, 4, -2, -4, 0, 0, 2, 126]


def test_matches_independent_numpy_float32_reference_and_never_reaches_minus_128():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(257, 96, generator=gen) * torch.exp(torch.randn(257, 1, generator=gen) * 3)
    x[::5, 7] *= 300  # outlier channels
    x[10] = 0  # a zero token
    x[11] = -x[11].abs()  # a row whose absmax is negative
    x = x.to(torch.bfloat16)
    a_q, s_a = quantize_per_token(x)
    q_ref, s_ref = _numpy_reference(x)
    assert np.array_equal(a_q.numpy(), q_ref)
    assert np.array_equal(s_a.numpy().view(np.int32), s_ref.view(np.int32))
    assert int(a_q.min()) >= -127 and int(a_q.max()) <= 127
    assert s_a.dtype == torch.float32 and a_q.dtype == torch.int8


def test_values_just_below_absmax_stay_inside_127():
    # Every element within one spacing of absmax: x * (127/absmax) must still round to 127 at most.
    row = torch.tensor([1.0 - 2.0**-8, 1.0, 1.0 - 2.0**-7], dtype=torch.bfloat16).repeat(64)
    a_q, _ = quantize_per_token(torch.stack([row, -row]))
    assert a_q.abs().max().item() == 127


@pytest.mark.parametrize("bad", [torch.zeros(4, dtype=torch.bfloat16), torch.zeros(2, 3, dtype=torch.int32)])
def test_rejects_non_matrix_or_integer_input(bad):
    with pytest.raises(InputError, match="activations"):
        quantize_per_token(bad)


def test_rejects_non_finite_input_naming_it():
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    x[1, 2] = float("inf")
    with pytest.raises(InputError, match="layer.7 input: 1 non-finite"):
        quantize_per_token(x, what="layer.7 input")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_gives_the_same_bytes_as_cpu():
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(512, 2048, generator=gen) * torch.exp(torch.randn(512, 1, generator=gen) * 2)).to(torch.bfloat16)
    x[5] = 0
    a_cpu, s_cpu = quantize_per_token(x)
    a_gpu, s_gpu = quantize_per_token(x.cuda())
    assert torch.equal(a_gpu.cpu(), a_cpu)
    assert torch.equal(s_gpu.cpu().view(torch.int32), s_cpu.view(torch.int32))


@pytest.mark.parametrize("bad", [float("nan"), -float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", [(0, 0), (2, 3), (1, 1)])
def test_any_non_finite_element_is_refused_wherever_it_sits(bad: float, where: tuple[int, int]) -> None:
    """The check reads each row's absmax, which a NaN (amax propagates it) or an infinity makes non-finite,
    beside rows of the largest finite bf16 values."""
    x = torch.full((3, 4), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    x[where] = bad
    with pytest.raises(InputError, match="1 non-finite"):
        quantize_per_token(x)
    with pytest.raises(InputError, match="2 non-finite"):
        quantize_per_token(torch.cat([x, torch.where(torch.arange(4) == 0, float("nan"), 1.0).bfloat16()[None]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_input_is_left_as_it_was(dtype: torch.dtype) -> None:
    """The scaling is taken in place on a copy: a float32 input (which ``.float()`` would return
    itself) keeps its values, and an all-zero row quantizes to zeros with scale 0."""
    x = torch.tensor([[1.5, -3.0, 0.25], [0.0, 0.0, 0.0]], dtype=dtype)
    before = x.clone()
    a_q, s_a = quantize_per_token(x)
    assert torch.equal(x, before)
    assert a_q.tolist() == [[64, -127, 11], [0, 0, 0]] and s_a[1].item() == 0.0
