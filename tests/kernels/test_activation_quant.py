"""The one-launch CUDA activation quantizer against the torch statement of the rule, bit for bit.

Both are run on the GPU and the torch rule on the CPU too: the W8A8 layers use the kernel on CUDA
and the torch operations on the CPU, so all three must give the same int8 codes and float32 scales.
"""

from __future__ import annotations

import pytest
import torch

from int8alibi.errors import InputError
from int8alibi.quant.activation import quantize_per_token

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the kernel is CUDA-only)")]


def _same_bits(x: torch.Tensor) -> None:
    from int8alibi.kernels.activation_quant import quantize_per_token_cuda

    q_k, s_k = quantize_per_token_cuda(x.cuda())
    q_t, s_t = quantize_per_token(x.cuda())
    q_c, s_c = quantize_per_token(x.cpu())
    assert torch.equal(q_k.cpu(), q_t.cpu()) and torch.equal(q_k.cpu(), q_c)
    assert torch.equal(s_k.cpu().view(torch.int32), s_t.cpu().view(torch.int32))
    assert torch.equal(s_k.cpu().view(torch.int32), s_c.view(torch.int32))


def test_boundary_rows():
    k = 2048 + 3  # a tail shorter than the kernel's block
    rows = torch.zeros(8, k, dtype=torch.float32)
    halves = torch.arange(k, dtype=torch.float32) % 254 - 126.5  # every x.5 in [-126.5, 126.5]
    rows[1] = halves
    rows[1, 0] = 127.0  # absmax 127: inverse 1, so each half is rounded half to even
    rows[2] = -halves
    rows[2, 5] = -127.0  # the largest magnitude negative
    rows[3, 7] = 2.0 ** -120  # a tiny absmax whose inverse 127/absmax is still finite
    rows[3, 9] = -(2.0 ** -121)
    rows[3, 11] = 2.0 ** -127  # bf16 subnormals whose codes are not zero under that inverse (1 and -2)
    rows[3, 12] = -3 * 2.0 ** -128
    rows[4] = torch.finfo(torch.bfloat16).max * torch.linspace(-1, 1, k)  # bf16's largest values
    rows[5, ::3] = 2.0 ** -133  # bf16 subnormals beside a normal absmax
    rows[5, 1] = 1.0
    rows[6] = torch.linspace(-3, 3, k)
    rows[7, k - 1] = -5.0  # the absmax in the tail only
    _same_bits(rows.to(torch.bfloat16))


@pytest.mark.parametrize("m", [1, 7, 512])
@pytest.mark.parametrize("k", [1000, 2048, 6144, 17408])
def test_random_rows_at_the_papers_shapes(m: int, k: int):
    g = torch.Generator().manual_seed(m * 100003 + k)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, m)[:, None]
    _same_bits(x.to(torch.bfloat16))
    _same_bits(x.to(torch.float32))


def test_non_finite_input_is_refused():
    from int8alibi.kernels.activation_quant import quantize_per_token_cuda

    x = torch.ones(3, 64, dtype=torch.bfloat16, device="cuda")
    x[1, 5] = float("nan")
    x[2, 0] = float("-inf")
    with pytest.raises(InputError, match="2 non-finite"):
        quantize_per_token_cuda(x, what="layer input")


def test_a_given_counter_collects_non_finite_elements_without_a_read_back():
    from int8alibi.kernels.activation_quant import quantize_per_token_cuda

    x = torch.ones(3, 64, dtype=torch.bfloat16, device="cuda")
    x[1, 5] = float("nan")
    counter = torch.zeros((), dtype=torch.int32, device="cuda")
    quantize_per_token_cuda(x, nonfinite=counter)  # no raise: the caller checks the counter
    quantize_per_token_cuda(x, nonfinite=counter)
    assert int(counter) == 2
    q, s = quantize_per_token_cuda(x[[0, 2]], nonfinite=counter)
    assert int(counter) == 2 and torch.equal(q.cpu(), quantize_per_token(x[[0, 2]].cpu())[0])
