"""GPU validation of the arms on the Qwen3-1.7B shapes: the identities the study rests on, measured.

For every distinct layer shape (K->N 2048->2048, 2048->1024, 2048->6144, 6144->2048) and M in
{1, 16, 512}, on seeded synthetic operands:

* ``cublaslt`` equals ``exact-cutlass-order`` and ``triton`` equals ``exact-triton-order`` bit for
  bit, and each exposes the exact accumulator;
* the exact emulations give the same bits on CPU and GPU;
* under power-of-two scales every arm agrees bit for bit;
* under real scales the two orders differ in a few elements per million, each by exactly one spacing.

Boundary operands (zero rows, all -128, accumulators above 2**24, subnormal and overflowing
scales) check arm == emulation where float32 is least forgiving. One more case overflows int32
(16256·K >= 2**31): outside the alibi's precondition nothing is required, and the table records
whether each kernel's accumulator wrapped or saturated.

``python -m int8alibi.tools.validate_gpu --json out.json`` prints a table, writes the JSON, and
exits 1 on any failure, 2 when no CUDA GPU is present (nothing was validated).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..arith import compare_bf16, exact_accumulator, int32_bound_holds, snap_pow2, wrap_int32
from ..errors import InputError
from ..kernels.base import Arm
from ..kernels.exact import EpilogueOrder, epilogue
from ..kernels.layer_operands import QWEN3_SHAPES, Operands, synthetic_layers
from ..kernels.registry import EMULATION_OF, get

MS = (1, 16, 512)
GPU_PAIR = {name: EMULATION_OF[name] for name in ("cublaslt", "triton")}
VLLM_PAIR = {name: EMULATION_OF[name] for name in ("vllm-cutlass", "vllm-triton")}
ORDER_CHECK = "cutlass order vs triton order: differences are one spacing"
ORDER_RATE_BOUND = 100.0  # per million: "a few" per million, with room for sampling noise


@dataclass
class Row:
    """One check on one operand set."""

    case: str
    m: int
    k: int
    n: int
    regime: str
    check: str
    result: str  # pass | fail | not applicable
    elements: int = 0
    differing: int = 0
    max_ulp: int | None = None
    detail: str = ""


def _bits_equal(x: torch.Tensor, y: torch.Tensor) -> int:
    """Number of elements whose bf16 bit patterns differ (x and y moved to the same device)."""
    return compare_bf16(x, y.to(x.device)).differing


def _pow2(s: torch.Tensor) -> torch.Tensor:
    """Scales snapped to the nearest power of two; zero scales (empty rows) stay zero."""
    positive = s > 0
    return torch.where(positive, snap_pow2(torch.where(positive, s, torch.ones_like(s)), "nearest"), s)


def _distinct_shapes(seed: int, device: str) -> Iterator[Operands]:
    """One layer of each distinct (K, N) of Qwen3-1.7B's first block, M=512, on ``device``."""
    seen: set[tuple[int, int]] = set()
    for op in synthetic_layers("qwen3-1.7b", m=max(MS), seed=seed, blocks=1, device=device):
        if (op.k, op.n) not in seen:
            seen.add((op.k, op.n))
            yield op


def _rows_slice(op: Operands, m: int) -> Operands:
    """The first ``m`` activation rows (per-token scales make rows independent)."""
    return Operands(op.layer, op.block, op.proj, op.a_q[:m].contiguous(), op.s_a[:m].contiguous(), op.w_q, op.s_w)


def _check_arms(
    case: str, op: Operands, regime: str, arms: dict[str, Arm], cpu_exact: dict[str, Arm], pairs: dict[str, str],
    rows: list[Row],
) -> dict[str, torch.Tensor]:
    """arm == emulation and CPU == GPU emulation on one operand set; returns the GPU outputs."""
    outs = {name: arm.scaled_mm(op.a_q, op.w_q, op.s_a, op.s_w) for name, arm in arms.items()}
    for arm_name, exact_name in pairs.items():
        if arm_name not in outs:
            continue
        cmp = compare_bf16(outs[exact_name], outs[arm_name])
        rows.append(Row(case, op.m, op.k, op.n, regime, check=f"{arm_name} == {exact_name}",
                        result="pass" if cmp.differing == 0 else "fail",
                        elements=cmp.elements, differing=cmp.differing, max_ulp=cmp.max_finite_ulp))
    cpu_op = op.to("cpu")
    for name, arm in cpu_exact.items():
        diff = _bits_equal(arm.scaled_mm(cpu_op.a_q, cpu_op.w_q, cpu_op.s_a, cpu_op.s_w), outs[name])
        rows.append(Row(case, op.m, op.k, op.n, regime, check=f"{name} cpu == gpu", result="pass" if diff == 0 else "fail",
                        elements=outs[name].numel(), differing=diff))
    return outs


def _check_accumulators(case: str, op: Operands, arms: dict[str, Arm], rows: list[Row]) -> None:
    exact = wrap_int32(exact_accumulator(op.a_q, op.w_q))
    for name in ("cublaslt", "triton"):
        acc = arms[name].accumulator(op.a_q, op.w_q)
        if acc is None:
            raise InputError(f"{name}: exposes no accumulator, which this check reads")
        diff = int(torch.ne(acc, exact).sum().item())
        rows.append(Row(case, op.m, op.k, op.n, "-", f"{name} accumulator == exact (int32-wrapped)",
                        "pass" if diff == 0 else "fail", elements=exact.numel(), differing=diff))


def _shape_checks(
    arms: dict[str, Arm], cpu_exact: dict[str, Arm], pairs: dict[str, str], seed: int, device: str
) -> list[Row]:
    rows: list[Row] = []
    for full in _distinct_shapes(seed, device):
        for m in MS:
            op = _rows_slice(full, m)
            case = f"qwen3-1.7b {full.proj}"
            _check_accumulators(case, op, arms, rows)
            real = _check_arms(case, op, "real", arms, cpu_exact, pairs, rows)
            cmp = compare_bf16(real["exact-cutlass-order"], real["exact-triton-order"])
            one_spacing = cmp.differing == 0 or cmp.max_finite_ulp == 1
            no_nonfinite = cmp.nonfinite_a == cmp.nonfinite_b == 0
            rows.append(Row(case, m, op.k, op.n, "real", ORDER_CHECK,
                            "pass" if one_spacing and no_nonfinite else "fail", elements=cmp.elements,
                            differing=cmp.differing, max_ulp=cmp.max_finite_ulp,
                            detail=f"{1e6 * cmp.differing / cmp.elements:.2f} per million"))
            pow2 = Operands(op.layer, op.block, op.proj, op.a_q, _pow2(op.s_a), op.w_q, _pow2(op.s_w))
            outs = _check_arms(case, pow2, "pow2", arms, cpu_exact, pairs, rows)
            ref = outs["exact-cutlass-order"]
            for name, y in outs.items():
                if name == "exact-cutlass-order":
                    continue
                cmp = compare_bf16(ref, y)
                rows.append(Row(case, m, op.k, op.n, "pow2", f"{name} == exact-cutlass-order",
                                "pass" if cmp.differing == 0 else "fail", elements=cmp.elements,
                                differing=cmp.differing, max_ulp=cmp.max_finite_ulp))
    return rows


def _boundary_cases(gen: torch.Generator) -> Iterator[tuple[str, Operands]]:
    """Operand sets at float32's and int32's edges (built on CPU from ``gen``)."""

    def ints(shape: tuple[int, int], values: list[int]) -> torch.Tensor:
        pick = torch.randint(0, len(values), shape, generator=gen)
        return torch.tensor(values, dtype=torch.int8)[pick]

    def scales(n: int, lo: float, hi: float) -> torch.Tensor:
        return (lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)).to(torch.float32)

    def op(name: str, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor) -> Operands:
        return Operands(name, 0, "boundary", a_q, s_a, w_q, s_w)

    m, k, n = 32, 2048, 1024
    full = list(range(-128, 128))
    a_q = ints((m, k), full)
    a_q[::3] = 0
    s_a = scales(m, 1e-3, 1e-1)
    s_a[::3] = 0.0
    yield "zero rows", op("zero-rows", a_q, s_a, ints((n, k), full), scales(n, 1e-4, 1e-3))
    yield "all -128", op("all-minus-128", torch.full((m, 6144), -128, dtype=torch.int8), scales(m, 1e-3, 1e-1),
                         torch.full((n, 6144), -128, dtype=torch.int8), scales(n, 1e-4, 1e-3))
    yield "|acc| > 2^24", op("large-acc", ints((m, 6144), [-128, -127]), scales(m, 1e-3, 1e-1),
                             ints((2048, 6144), [-128, -127]), scales(2048, 1e-4, 1e-3))
    yield "subnormal scales", op("subnormal", ints((m, k), full), scales(m, 1e-44, 1.2e-38),
                                 ints((n, k), full), scales(n, 1e-4, 1e-3))
    yield "overflowing scales", op("overflow", ints((m, k), full), scales(m, 1e30, 1e31),
                                   ints((n, k), full), scales(n, 1e3, 1e4))
    deep = 132112  # 16256 * K >= 2**31: every partial sum grows past int32
    yield "int32 overflow", op("int32-overflow", torch.full((16, deep), -128, dtype=torch.int8),
                               scales(16, 1e-3, 1e-1), ints((16, deep), [-128, -127]), scales(16, 1e-4, 1e-3))
    # Partial sums pass 2**31 in the first half of K and come back in the second: the exact total
    # fits int32 (so wrapping is harmless), but a saturating accumulator stays clamped.
    half = 140000
    w_q = torch.cat([torch.full((16, half), -128, dtype=torch.int8), torch.full((16, half), 127, dtype=torch.int8)], 1)
    yield "int32 there and back", op("int32-there-and-back", torch.full((16, 2 * half), -128, dtype=torch.int8),
                                     scales(16, 1e-3, 1e-1), w_q, scales(16, 1e-4, 1e-3))


def _overflow_rows(case: str, op: Operands, arms: dict[str, Arm], rows: list[Row]) -> None:
    """16256·K >= 2**31: the alibi's precondition fails, so equality is not a requirement; record what
    each arm's int32 accumulator and output match: the two's-complement wrap or saturation."""
    exact = exact_accumulator(op.a_q, op.w_q)
    candidates = {"wrapped": wrap_int32(exact), "saturated": exact.clamp(-2**31, 2**31 - 1).to(torch.int32)}
    for name in ("cublaslt", "triton"):
        arm = arms[name]
        order: EpilogueOrder = "cutlass" if name == "cublaslt" else "triton"
        acc, out = arm.accumulator(op.a_q, op.w_q), arm.scaled_mm(op.a_q, op.w_q, op.s_a, op.s_w)
        if acc is None:
            raise InputError(f"{name}: exposes no accumulator, which this check reads")
        found = []
        for label, cand in candidates.items():
            same_out = acc.numel() - _bits_equal(out, epilogue(cand, op.s_a, op.s_w, order))
            found.append(f"{label}: accumulator {int(torch.eq(acc, cand).sum())}/{acc.numel()}, output {same_out}")
        values = f"acc[0,0]={int(acc[0, 0])}, exact={int(exact[0, 0])}"
        rows.append(Row(case, op.m, op.k, op.n, "boundary", f"{name} under int32 overflow (16256*K >= 2^31)",
                        "not applicable", elements=acc.numel(),
                        detail=f"precondition violated, no requirement; {values}; equal to " + "; ".join(found)))


def _boundary_checks(
    arms: dict[str, Arm], cpu_exact: dict[str, Arm], pairs: dict[str, str], seed: int, device: str
) -> list[Row]:
    rows: list[Row] = []
    for case, cpu_op in _boundary_cases(torch.Generator().manual_seed(seed)):
        op = cpu_op.to(device)
        if not int32_bound_holds(op.k):
            _overflow_rows(case, op, arms, rows)
            continue
        _check_accumulators(case, op, arms, rows)
        _check_arms(case, op, "boundary", arms, cpu_exact, pairs, rows)
    return rows


def _order_rate_row(rows: list[Row]) -> Row:
    """Over all shapes, the two orders must differ somewhere (else one arm ran the other's order), rarely."""
    order = [r for r in rows if r.check == ORDER_CHECK]
    elements, differing = sum(r.elements for r in order), sum(r.differing for r in order)
    rate = 1e6 * differing / elements if elements else 0.0
    ok = 0 < rate <= ORDER_RATE_BOUND
    return Row("all shapes", 0, 0, 0, "real", f"orders differ in 0 < rate <= {ORDER_RATE_BOUND:g} per million",
               "pass" if ok else "fail", elements=elements, differing=differing, detail=f"{rate:.2f} per million")


def validate(seed: int = 0, device: str = "cuda") -> tuple[list[Row], dict[str, object]]:
    """All checks with the arms built for ``device`` (the GPU); returns the rows and the arms' evidence."""
    names = ["exact-cutlass-order", "exact-triton-order", *GPU_PAIR, *VLLM_PAIR]
    arms: dict[str, Arm] = {}
    rows: list[Row] = []
    for name in names:
        arm = get(name, device)
        ok, why = arm.available()
        if ok:
            arms[name] = arm
        elif name in VLLM_PAIR:
            rows.append(Row(name, 0, 0, 0, "-", f"{name} == {VLLM_PAIR[name]}", "not applicable", detail=why))
        else:
            rows.append(Row(name, 0, 0, 0, "-", "arm available", "fail", detail=why))
    if any(r.result == "fail" for r in rows):
        return rows, {}
    cpu_exact = {name: get(name, "cpu") for name in ("exact-cutlass-order", "exact-triton-order")}
    pairs = {**GPU_PAIR, **VLLM_PAIR}
    rows += _shape_checks(arms, cpu_exact, pairs, seed, device)
    rows.append(_order_rate_row(rows))
    rows += _boundary_checks(arms, cpu_exact, pairs, seed, device)
    return rows, {name: arm.evidence() for name, arm in arms.items()}


def summarize(rows: list[Row]) -> dict[str, object]:
    """Totals: failures, and the real-scale order difference per million over all shapes."""
    order = [r for r in rows if r.check == ORDER_CHECK]
    elements = sum(r.elements for r in order)
    differing = sum(r.differing for r in order)
    return {
        "checks": len(rows),
        "passed": sum(r.result == "pass" for r in rows),
        "failed": sum(r.result == "fail" for r in rows),
        "not_applicable": sum(r.result == "not applicable" for r in rows),
        "order_difference": {
            "elements": elements,
            "differing": differing,
            "per_million": 1e6 * differing / elements if elements else None,
            "max_ulp": max((r.max_ulp or 0 for r in order), default=None),
        },
    }


def _print_table(rows: list[Row], out: Callable[[str], None]) -> None:
    out(f"{'case':<22} {'M':>4} {'K':>6} {'N':>5} {'regime':<8} {'result':<14} {'differ':>7} {'ulp':>4}  check")
    for r in rows:
        ulp = "-" if r.max_ulp is None else str(r.max_ulp)
        out(f"{r.case:<22} {r.m:>4} {r.k:>6} {r.n:>5} {r.regime:<8} {r.result:<14} {r.differing:>7} {ulp:>4}  "
            f"{r.check}{'  [' + r.detail + ']' if r.detail else ''}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m int8alibi.tools.validate_gpu",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=Path("validate_gpu.json"), help="where to write the results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("validate_gpu: not applicable: no CUDA GPU visible to torch; nothing was validated", file=sys.stderr)
        return 2
    rows, evidence = validate(args.seed)
    summary = summarize(rows)
    _print_table(rows, print)
    print(json.dumps(summary, indent=1))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(
        {"summary": summary, "rows": [asdict(r) for r in rows], "evidence": evidence,
         "shapes": {"model": "qwen3-1.7b", "layers": len(QWEN3_SHAPES["qwen3-1.7b"].layers()), "m": list(MS)}},
        indent=1, default=str))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
