"""The cuBLASLt arm: padding for torch._int_mm, refusal off-GPU, and (on a GPU) equality with the emulation."""

from __future__ import annotations

import pytest
import torch

from int8alibi.arith import exact_accumulator
from int8alibi.errors import InputError
from int8alibi.kernels import get
from int8alibi.kernels.cublaslt import INT_MM_MIN_ROWS, CublasLtArm, int_mm_accumulator, pad_rows

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def test_pad_rows_appends_zero_rows_only_when_needed():
    a = torch.randint(-128, 128, (3, 16), dtype=torch.int8)
    padded = pad_rows(a)
    assert padded.shape == (INT_MM_MIN_ROWS, 16)
    assert torch.equal(padded[:3], a) and not padded[3:].any()
    big = torch.randint(-128, 128, (40, 16), dtype=torch.int8)
    assert pad_rows(big) is big


@pytest.mark.parametrize("m", [1, 16, 17, 33])
def test_int_mm_accumulator_slices_back_to_m(m):
    """torch._int_mm also runs on CPU, which checks the pad-and-slice logic without a GPU."""
    g = torch.Generator().manual_seed(m)
    a = torch.randint(-128, 128, (m, 64), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (24, 64), generator=g, dtype=torch.int8)
    acc = int_mm_accumulator(a, w)
    assert acc.dtype == torch.int32 and acc.shape == (m, 24)
    assert torch.equal(acc.to(torch.int64), exact_accumulator(a, w))


def test_unavailable_on_cpu_says_why():
    ok, why = CublasLtArm("cpu").available()
    assert not ok and "CUDA" in why


def test_refuses_cpu_operands_and_bad_shapes():
    a = torch.zeros(4, 20, dtype=torch.int8)
    w = torch.zeros(8, 20, dtype=torch.int8)
    with pytest.raises(InputError, match="selected for cuda"):
        CublasLtArm("cuda").scaled_mm(a, w, torch.ones(4), torch.ones(8))
    with pytest.raises(InputError, match="K=20 is not a multiple of 8"):
        CublasLtArm("cpu").accumulator(a, w)


def test_evidence():
    ev = CublasLtArm("cpu").evidence()
    assert ev["arm"] == "cublaslt" and ev["is_emulation"] is False and ev["epilogue_order"] == "cutlass"
    assert "torch._int_mm" in ev["implementation"]


@CUDA
@pytest.mark.parametrize("m", [1, 16, 17, 512])
def test_gpu_equals_exact_cutlass_order(m):
    g = torch.Generator().manual_seed(m)
    a_q = torch.randint(-128, 128, (m, 2048), generator=g, dtype=torch.int8).cuda()
    w_q = torch.randint(-128, 128, (1024, 2048), generator=g, dtype=torch.int8).cuda()
    s_a = (torch.rand(m, generator=g) * 0.1 + 1e-3).cuda()
    s_w = (torch.rand(1024, generator=g) * 1e-3 + 1e-4).cuda()
    arm, ref = get("cublaslt", "cuda"), get("exact-cutlass-order", "cuda")
    y, expected = arm.scaled_mm(a_q, w_q, s_a, s_w), ref.scaled_mm(a_q, w_q, s_a, s_w)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(arm.accumulator(a_q, w_q), ref.accumulator(a_q, w_q))


@CUDA
@pytest.mark.gpu
def test_reused_padding_buffers_keep_their_zero_rows_and_every_result_exact():
    """Calls of M = 1..16 rows and two K, interleaved and repeated, each equal to the exact arm, and
    every buffer's rows beyond its M still zero afterwards (a row of one call never pads another)."""
    g = torch.Generator().manual_seed(7)
    arm, ref = CublasLtArm("cuda"), get("exact-cutlass-order", "cuda")  # a fresh arm: no buffers yet
    weights = {k: torch.randint(-128, 128, (64, k), generator=g, dtype=torch.int8).cuda() for k in (64, 2048)}
    s_w = (torch.rand(64, generator=g) * 1e-3 + 1e-4).cuda()
    for _ in range(2):
        for m in (16, 1, 5, 16, 1, 2):
            for k, w_q in weights.items():
                a_q = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8).cuda()
                s_a = (torch.rand(m, generator=g) * 0.1 + 1e-3).cuda()
                y, expected = arm.scaled_mm(a_q, w_q, s_a, s_w), ref.scaled_mm(a_q, w_q, s_a, s_w)
                assert torch.equal(y.view(torch.int16), expected.view(torch.int16)), (m, k)
    assert sorted(key[:2] for key in arm._pads) == sorted((m, k) for m in (1, 2, 5, 16) for k in weights)
    assert all(not pad[m:].any() for (m, _, _), pad in arm._pads.items())


EPILOGUE_CHILD = r'''
import json, torch
from int8alibi.kernels.exact import epilogue
from int8alibi.kernels.triton_arm import cutlass_epilogue, interpreted
assert interpreted()
g = torch.Generator().manual_seed(5)
results = []
for m, n in ((1, 1), (33, 130), (64, 256)):
    acc = torch.randint(-2**31, 2**31, (m, n), generator=g, dtype=torch.int64).to(torch.int32)
    acc.view(-1)[:4] = torch.tensor([2**31 - 1, -2**31, 0, 2**24 + 1], dtype=torch.int32)[:acc.numel()]
    s_a = torch.rand(m, generator=g) * 1e-3
    s_w = torch.rand(n, generator=g) * 1e-2
    s_a[0], s_w[0] = 1e-38, 3e-39                      # subnormal products
    if n > 1:
        s_w[1] = 1e30                                  # overflow to inf
    y = cutlass_epilogue(acc, s_a, s_w)
    results.append(bool(torch.equal(y.view(torch.int16), epilogue(acc, s_a, s_w, "cutlass").view(torch.int16))))
print(json.dumps(results))
'''


def test_fused_epilogue_is_the_cutlass_order_under_the_interpreter():
    """The one-kernel epilogue the cuBLASLt arm runs on a GPU, bit for bit ``exact.epilogue(.., "cutlass")``."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", EPILOGUE_CHILD], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, True, True]
