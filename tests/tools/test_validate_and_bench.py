"""validate_gpu off-GPU (not applicable, never passed), its summary, and ``bench kernels`` on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from int8alibi.tools.bench import main as bench_main
from int8alibi.tools.validate_gpu import ORDER_CHECK, Row, main as validate_main, summarize

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")


@NO_GPU
def test_validate_without_gpu_is_not_applicable(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert validate_main(["--json", str(out)]) == 2
    assert "not applicable" in capsys.readouterr().err
    assert not out.exists()


def test_summary_counts_and_order_rate():
    rows = [
        Row("a", 4, 16, 8, "real", ORDER_CHECK, "pass",
            elements=1_000_000, differing=6, max_ulp=1),
        Row("b", 4, 16, 8, "real", ORDER_CHECK, "pass",
            elements=1_000_000, differing=4, max_ulp=1),
        Row("b", 4, 16, 8, "pow2", "triton == exact-cutlass-order", "fail", elements=10, differing=1, max_ulp=1),
        Row("vllm-triton", 0, 0, 0, "-", "vllm-triton == exact-triton-order", "not applicable"),
    ]
    s = summarize(rows)
    assert (s["checks"], s["passed"], s["failed"], s["not_applicable"]) == (4, 2, 1, 1)
    assert s["order_difference"]["per_million"] == pytest.approx(5.0) and s["order_difference"]["max_ulp"] == 1


def test_bench_kernels_on_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench_main(["kernels", "--device", "cpu", "--shape", "64x32", "--shape", "128x16", "--m", "3",
                     "--iters", "2", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert {r["arm"] for r in data["rows"]} == {"exact-cutlass-order", "exact-triton-order"}
    assert {(r["k"], r["n"]) for r in data["rows"]} == {(64, 32), (128, 16)}
    assert all(r["ratio"] > 0 and r["baseline"] == "float64 matmul" for r in data["rows"])
    assert "float64 matmul" in capsys.readouterr().out


def test_bench_rejects_bad_arguments(capsys):
    assert bench_main(["nope"]) == 2
    assert bench_main(["kernels", "--device", "cpu", "--shape", "64by32"]) == 1
    assert "not KxN" in capsys.readouterr().err
