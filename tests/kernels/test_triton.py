"""The Triton kernel: under TRITON_INTERPRET=1 on CPU, bit for bit equal to exact-triton-order.

The interpreter reads TRITON_INTERPRET when the kernel is defined (at import), so those checks run
in a child process. The kernel rounds to bf16 with integer bit operations, so the interpreter and
the GPU compute the same bits; the GPU test below (skipped without one) is the authority. All cases
stay inside 16256·K < 2**31: beyond it the interpreter's int32 matmul wraps while the GPU's
saturates, so an interpreter result there would say nothing about the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")

from int8alibi.errors import InputError  # noqa: E402
from int8alibi.kernels import get  # noqa: E402
from int8alibi.kernels.triton_arm import SWEEP_CONFIGS, TILE_TABLE, TritonArm, config_for, interpreted  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

# Runs in the interpreter: builds random and boundary operands, returns per-case equality as JSON.
CHILD = textwrap.dedent(r'''
    import json, sys
    import torch
    from int8alibi.kernels import get
    from int8alibi.kernels.triton_arm import interpreted

    g = torch.Generator().manual_seed(7)

    def ints(shape, values=None):
        if values is None:
            return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
        return torch.tensor(values, dtype=torch.int8)[torch.randint(0, len(values), shape, generator=g)]

    def scales(n, lo, hi):
        return (lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)).to(torch.float32)

    cases = {}
    for m, k, n in [(1, 64, 32), (5, 48, 16), (16, 256, 64), (17, 160, 48), (33, 272, 80), (70, 128, 144)]:
        cases[f"random {m}x{k}x{n}"] = (ints((m, k)), ints((n, k)), scales(m, 1e-3, 1e-1), scales(n, 1e-4, 1e-3))
    cases["subnormal scales"] = (ints((8, 128)), ints((32, 128)), scales(8, 1e-44, 1.2e-38), scales(32, 1e-4, 1e-3))
    a_q = ints((9, 64)); a_q[::2] = 0
    s_a = scales(9, 1e-3, 1e-1); s_a[::2] = 0.0
    cases["zero rows"] = (a_q, ints((16, 64)), s_a, scales(16, 1e-4, 1e-3))
    cases["all -128"] = (torch.full((4, 6144), -128, dtype=torch.int8), torch.full((16, 6144), -128, dtype=torch.int8),
                         scales(4, 1e-3, 1e-1), scales(16, 1e-4, 1e-3))
    cases["|acc| > 2^24"] = (ints((4, 6144), [-128, -127]), ints((16, 6144), [-128, -127]),
                             scales(4, 1e-3, 1e-1), scales(16, 1e-4, 1e-3))
    cases["overflow to inf"] = (ints((4, 512)), ints((16, 512)), scales(4, 1e30, 1e31), scales(16, 1e3, 1e4))
    s_w = scales(16, 1e-4, 1e-3); s_w[3] = 0.0
    cases["nan from inf*0"] = (torch.full((2, 6144), -128, dtype=torch.int8),
                              torch.full((16, 6144), -128, dtype=torch.int8), torch.tensor([1e38, 1e-3]), s_w)

    tri, ref = get("triton", "cpu"), get("exact-triton-order", "cpu")
    out = {"interpreted": interpreted(), "available": tri.available()[0], "cases": {}}
    for name, (a_q, w_q, s_a, s_w) in cases.items():
        y, e = tri.scaled_mm(a_q, w_q, s_a, s_w), ref.scaled_mm(a_q, w_q, s_a, s_w)
        acc_equal = torch.equal(tri.accumulator(a_q, w_q), ref.accumulator(a_q, w_q))
        out["cases"][name] = {
            # NaN bits: the interpreter multiplies on this CPU (x86 makes 0xFFC00000 for inf*0),
            # the emulation gives the GPU's canonical NaN; the GPU tests compare NaN bits for real.
            "bits_equal": torch.equal(torch.isnan(y), torch.isnan(e))
                          and torch.equal(y.view(torch.int16)[~torch.isnan(e)], e.view(torch.int16)[~torch.isnan(e)]),
            "accumulator_equal": acc_equal,
            "nan": int(torch.isnan(e).sum()), "inf": int(torch.isinf(e).sum()),
            "subnormal": int(((e.view(torch.int16) & 0x7F80) == 0).sum() - (e == 0).sum()),
        }
    json.dump(out, sys.stdout)
''')


@pytest.fixture(scope="module")
def interpreter_run() -> dict:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the kernel itself is checked against the emulation (test_gpu_*)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_interpreter_is_really_used(interpreter_run):
    assert interpreter_run["interpreted"] is True and interpreter_run["available"] is True


def test_interpreter_equals_exact_triton_order_bit_for_bit(interpreter_run):
    cases = interpreter_run["cases"]
    assert len(cases) == 12
    for name, result in cases.items():
        assert result["bits_equal"], name
        assert result["accumulator_equal"], name


def test_boundary_cases_exercise_what_they_claim(interpreter_run):
    cases = interpreter_run["cases"]
    assert cases["overflow to inf"]["inf"] > 0
    assert cases["nan from inf*0"]["nan"] == 1  # row 0 x column 3 only: s_a*acc = inf, then * 0
    assert cases["subnormal scales"]["subnormal"] > 0


def test_tile_table_covers_every_m_in_order():
    bounds = [bound for bound, _ in TILE_TABLE]
    assert bounds == sorted(bounds) and bounds[-1] >= 2**31 - 1
    assert config_for(1) == TILE_TABLE[0][1]
    assert config_for(bounds[0] + 1) == TILE_TABLE[1][1]
    for _, cfg in TILE_TABLE:
        assert cfg in SWEEP_CONFIGS  # the table is picked from the timed candidates


@pytest.mark.skipif(interpreted(), reason="this process runs under TRITON_INTERPRET=1")
def test_cpu_without_interpreter_is_unavailable():
    ok, why = TritonArm("cpu").available()
    assert not ok and "TRITON_INTERPRET" in why


def test_shape_requirements_are_refused_before_launch():
    g = torch.Generator().manual_seed(0)
    a_q = torch.randint(-128, 128, (4, 40), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (16, 40), generator=g, dtype=torch.int8)
    with pytest.raises(InputError, match="K=40 is not a multiple of 16"):
        TritonArm("cpu").scaled_mm(a_q, w_q, torch.ones(4), torch.ones(16))


def test_evidence_names_the_kernel_and_table():
    ev = TritonArm("cpu").evidence()
    assert ev["arm"] == "triton" and ev["is_emulation"] is False and ev["epilogue_order"] == "triton"
    assert "_w8a8_kernel" in ev["implementation"] and len(ev["tile_table"]) == len(TILE_TABLE)


@CUDA
@pytest.mark.parametrize("m", [1, 16, 17, 100, 512])
def test_gpu_equals_exact_triton_order(m):
    g = torch.Generator().manual_seed(m)
    a_q = torch.randint(-128, 128, (m, 2048), generator=g, dtype=torch.int8).cuda()
    w_q = torch.randint(-128, 128, (1040, 2048), generator=g, dtype=torch.int8).cuda()
    s_a = (torch.rand(m, generator=g) * 0.1 + 1e-3).cuda()
    s_w = (torch.rand(1040, generator=g) * 1e-3 + 1e-4).cuda()
    tri, ref = get("triton", "cuda"), get("exact-triton-order", "cuda")
    y, expected = tri.scaled_mm(a_q, w_q, s_a, s_w), ref.scaled_mm(a_q, w_q, s_a, s_w)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(tri.accumulator(a_q, w_q), ref.accumulator(a_q, w_q))


@CUDA
@pytest.mark.parametrize("arm_name,reference", [("triton", "exact-triton-order"), ("cublaslt", "exact-cutlass-order")])
def test_gpu_calls_after_the_first_launch_directly_and_stay_exact(arm_name, reference):
    """The first call compiles and remembers the launch; later calls (same operands, fresh operands of
    the same shape, other shapes, then the first again) go through Triton's launcher directly and
    must give the emulation's bits every time (a launcher given a wrong grid or argument list fails
    or differs only from the second call on)."""
    arm, ref = get(arm_name, "cuda"), get(reference, "cuda")
    g = torch.Generator().manual_seed(7)

    def operands(m: int, n: int) -> tuple[torch.Tensor, ...]:
        return (torch.randint(-128, 128, (m, 512), generator=g, dtype=torch.int8).cuda(),
                torch.randint(-128, 128, (n, 512), generator=g, dtype=torch.int8).cuda(),
                (torch.rand(m, generator=g) * 0.1 + 1e-3).cuda(), (torch.rand(n, generator=g) * 1e-3 + 1e-4).cuda())

    first, fresh, other = operands(64, 256), operands(64, 256), operands(3, 128)
    for ops in (first, first, first, fresh, other, other, first):
        y, expected = arm.scaled_mm(*ops), ref.scaled_mm(*ops)
        assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
        assert torch.equal(arm.accumulator(*ops[:2]), ref.accumulator(*ops[:2]))
