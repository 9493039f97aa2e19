"""On a CUDA GPU: the boundary operands through the real kernels, and ``validate_gpu`` as a test.

The boundary operands (zero rows, all -128, |acc| > 2^24, subnormal and overflowing scales, inf * 0)
go through ``cublaslt`` and ``triton`` on the GPU and must give the bits of their exact emulation
(``registry.EMULATION_OF``) run on the same GPU, NaNs bit for bit, and the same int32 accumulator.
Off a GPU these tests are skipped, saying why (only the check that the operand sets reach their edges
runs on CPU); the Triton interpreter covers the kernel's arithmetic on CPU (test_triton.py), never
its binary.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

from int8alibi.arith import exact_accumulator, f32_exact, wrap_int32
from int8alibi.kernels import get
from int8alibi.kernels.registry import EMULATION_OF

NO_CUDA = ("no CUDA GPU visible to torch: the cublaslt and triton arms run only on a CUDA device, so there is no "
           "kernel binary to compare with the emulations here")


def gpu(test=None, *, reason: str = NO_CUDA):
    """Marked ``gpu`` and skipped, saying why, where torch sees no CUDA device."""
    if test is None:
        return lambda t: gpu(t, reason=reason)
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason=reason)(test))


REAL_ARMS = ("cublaslt", "triton")


def arm_or_skip(name: str, device: str = "cuda"):
    """The named arm on ``device``; skipped, with the arm's own reason, where it cannot run (e.g. Triton
    not installed, or TRITON_INTERPRET=1 set)."""
    arm = get(name, device)
    ok, why = arm.available()
    if not ok:
        pytest.skip(f"{name} is not available on this GPU host: {why}")
    return arm


def boundary_cases() -> Iterator[tuple[str, tuple[torch.Tensor, ...]]]:
    """Seeded operand sets at float32's and bf16's edges, on CPU; every K a multiple of 16, every N of 16."""
    g = torch.Generator().manual_seed(19)

    def ints(shape: tuple[int, int], values: list[int] | None = None) -> torch.Tensor:
        if values is None:
            return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
        return torch.tensor(values, dtype=torch.int8)[torch.randint(0, len(values), shape, generator=g)]

    def scales(n: int, lo: float, hi: float) -> torch.Tensor:
        return (lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)).to(torch.float32)

    a_q, s_a = ints((33, 2048)), scales(33, 1e-3, 1e-1)
    a_q[::3], s_a[::3] = 0, 0.0
    yield "zero rows", (a_q, ints((1024, 2048)), s_a, scales(1024, 1e-4, 1e-3))
    minus = lambda rows: torch.full((rows, 6144), -128, dtype=torch.int8)  # noqa: E731
    yield "all -128", (minus(32), minus(256), scales(32, 1e-3, 1e-1), scales(256, 1e-4, 1e-3))
    yield "all -128, M=1", (minus(1), minus(256), scales(1, 1e-3, 1e-1), scales(256, 1e-4, 1e-3))
    yield "|acc| > 2^24", (ints((32, 6144), [-128, -127]), ints((512, 6144), [-128, -127]),
                           scales(32, 1e-3, 1e-1), scales(512, 1e-4, 1e-3))
    yield "subnormal scales", (ints((32, 2048)), ints((1024, 2048)), scales(32, 1e-44, 1.2e-38),
                               scales(1024, 1e-4, 1e-3))
    yield "subnormal outputs", (ints((17, 256)), ints((64, 256)), scales(17, 1.17e-38, 1.18e-38),
                                scales(64, 1e-7, 1e-6))
    yield "overflowing scales", (ints((32, 2048)), ints((1024, 2048)), scales(32, 1e30, 1e31),
                                 scales(1024, 1e3, 1e4))
    # inf * 0: |acc| = 2^14 * 6144 times 1e38 overflows float32; the zero scale multiplied last makes
    # NaN (CUTLASS order multiplies s_a last, Triton order s_w). Row 2 has a negative accumulator.
    a_q = minus(3)
    a_q[2] = 127
    yield "inf * 0", (a_q, minus(16), torch.tensor([1e38, 0.0, 0.0]),
                      torch.tensor([1e38, 0.0, 1e38] + [1e-3] * 13))


CASES = dict(boundary_cases())
NAN_AT = {"exact-cutlass-order": [(1, 0), (1, 2), (2, 0), (2, 2)], "exact-triton-order": [(0, 1)]}


def bit_diff(x: torch.Tensor, y: torch.Tensor) -> str:
    """How two bf16 tensors differ bitwise (NaN payloads and signed zeros count): count and first places."""
    xb, yb = x.cpu().view(torch.int16), y.cpu().view(torch.int16)
    where = (xb != yb).nonzero().tolist()
    first = ", ".join(f"{tuple(i)}: {int(xb[tuple(i)]) & 0xFFFF:#06x} vs {int(yb[tuple(i)]) & 0xFFFF:#06x}"
                      for i in where[:5])
    return f"{len(where)} of {x.numel()} differ ({first})"


def test_boundary_cases_exercise_what_they_claim() -> None:
    """On CPU too: the operand sets really reach their edge (checked with the CPU emulations)."""
    cutlass, triton = get("exact-cutlass-order", "cpu"), get("exact-triton-order", "cpu")
    acc = exact_accumulator(*CASES["|acc| > 2^24"][:2])
    assert not bool(f32_exact(acc).any())
    assert bool((exact_accumulator(*CASES["all -128"][:2]) == 2**14 * 6144).all())
    for name in ("subnormal scales", "subnormal outputs"):
        bits = cutlass.scaled_mm(*CASES[name]).view(torch.int16).to(torch.int32) & 0x7FFF
        assert bool(((bits > 0) & (bits < 0x0080)).any()), name
    assert bool(torch.isinf(cutlass.scaled_mm(*CASES["overflowing scales"])).any())
    for arm in (cutlass, triton):
        nan = torch.isnan(arm.scaled_mm(*CASES["inf * 0"]))
        assert sorted(map(tuple, nan.nonzero().tolist())) == NAN_AT[arm.name]


@gpu
@pytest.mark.parametrize("arm_name", REAL_ARMS)
@pytest.mark.parametrize("case", list(CASES))
def test_real_kernel_equals_its_emulation_on_boundary_operands(arm_name: str, case: str, bits_match) -> None:
    arm = arm_or_skip(arm_name)
    emulation = get(EMULATION_OF[arm_name], "cuda")
    a_q, w_q, s_a, s_w = (t.cuda() for t in CASES[case])
    y, expected = arm.scaled_mm(a_q, w_q, s_a, s_w), emulation.scaled_mm(a_q, w_q, s_a, s_w)
    assert y.dtype == torch.bfloat16 and y.device.type == "cuda"
    assert bits_match(y, expected), f"{arm_name} vs {emulation.name} on {case}: {bit_diff(y, expected)}"
    acc = arm.accumulator(a_q, w_q)
    assert torch.equal(acc.cpu(), wrap_int32(exact_accumulator(a_q, w_q)).cpu()), f"{arm_name} accumulator on {case}"
    if case == "inf * 0":
        assert sorted(map(tuple, torch.isnan(y).nonzero().tolist())) == NAN_AT[emulation.name]


@gpu(reason="no CUDA GPU visible to torch: there is no GPU emulation to compare the CPU emulation with")
@pytest.mark.parametrize("order", ["cutlass", "triton"])
def test_emulations_give_the_same_bits_on_cpu_and_gpu_at_the_boundaries(order: str, bits_match) -> None:
    """kernels/exact.py: "CPU and GPU give the same bits, NaNs included". The inf * 0 case tests the
    NaN part: the NaN there is made by a float32 multiply on each device."""
    cpu, gpu = get(f"exact-{order}-order", "cpu"), get(f"exact-{order}-order", "cuda")
    for case, ops in CASES.items():
        y_cpu, y_gpu = cpu.scaled_mm(*ops), gpu.scaled_mm(*(t.cuda() for t in ops)).cpu()
        assert bits_match(y_cpu, y_gpu), f"{cpu.name} cpu vs gpu on {case}: {bit_diff(y_cpu, y_gpu)}"


@gpu
def test_validate_gpu_reports_no_failure(record_property) -> None:
    """``python -m int8alibi.tools.validate_gpu`` as a test: every check passes or is not applicable;
    not applicable is reported on its own (a warning and a property), never counted as passed."""
    from int8alibi.tools.validate_gpu import VLLM_PAIR, summarize, validate

    for name in REAL_ARMS:
        arm_or_skip(name)
    rows, evidence = validate(seed=0, device="cuda")
    summary = summarize(rows)
    failed = [r for r in rows if r.result == "fail"]
    assert not failed, f"{len(failed)} validate_gpu check(s) failed:\n" + "\n".join(
        f"{r.case} M={r.m} K={r.k} N={r.n} {r.regime}: {r.check}: {r.differing}/{r.elements} differ, "
        f"max ulp {r.max_ulp} {r.detail}" for r in failed[:20])
    assert {r.result for r in rows} <= {"pass", "not applicable"}
    passed = [r for r in rows if r.result == "pass"]
    not_applicable = [r for r in rows if r.result == "not applicable"]
    assert passed and summary["passed"] == len(passed) and summary["not_applicable"] == len(not_applicable)
    assert {"cublaslt", "triton"} <= set(evidence)
    # Not applicable only where validate_gpu states no requirement: an absent vLLM arm, or the int32
    # overflow cases outside 16256*K < 2^31 (which record wrap vs saturation instead).
    for r in not_applicable:
        assert r.case in VLLM_PAIR or "16256*K >= 2^31" in r.check, r
    lines = [f"{r.case} {r.check}: {r.detail}" for r in not_applicable]
    record_property("validate_gpu", {"passed": len(passed), "not_applicable": lines, "summary": summary})
    warnings.warn(f"validate_gpu: {len(passed)} passed, 0 failed, {len(not_applicable)} not applicable "
                  "(not counted as passed): " + "; ".join(lines), stacklevel=1)
