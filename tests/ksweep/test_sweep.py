"""The K sweep's tables: fits and summary on synthetic counts, counts rows through the Parquet
schema, arm choice, and (on a GPU) a reduced sweep whose INT8 arms equal their exact emulations.
(The stage's "not run" tables without a GPU: tests/stages/test_ksweep.py.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from int8alibi.ksweep import arms as ksweep_arms
from int8alibi.ksweep import sweep
from int8alibi.protocol import load
from int8alibi.files.parquet import read_table

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return copy.deepcopy(dict(load(PROJECT / "preregistration").ksweep))


def _synthetic_counts(spec: dict[str, Any]) -> pd.DataFrame:
    """Binomial counts: INT8 at a constant 5 per million, FP8 on 1 - exp(-c K^0.518); magnitudes
    (relative differences, ulp, >= 2 ulp counts) drawn from a second generator, growing with K."""
    rng = np.random.default_rng(0)  # fixed: under a constant rate the test rejects 5% of draws
    size = np.random.default_rng(1)
    elements = spec["grid"]["m"] * spec["grid"]["n"]
    rows = []
    for p in spec["pairs"]:
        for k in spec["grid"]["k"]:
            rate = 5e-6 if p["format"] == "int8" or p["id"] == "fp8-cutlass-triton" else \
                -np.expm1(-0.08 / 512**0.518 * k**0.518)
            depth = np.log2(k / 256)
            for seed in spec["grid"]["seeds"]:
                d = int(rng.binomial(elements, rate))
                far = int(d * 0.9)
                grows = p["format"] == "fp8" and far > 0
                rows.append({"pair": p["id"], "format": p["format"], "k": k, "seed": seed, "arm_a": p["arms"][0],
                             "arm_b": p["arms"][1], "status": sweep.RUN, "m": spec["grid"]["m"],
                             "n": spec["grid"]["n"], "elements": elements, "differing": d,
                             "prevalence": d / elements, "differing_non_near_zero": far,
                             "ge2_ulp_non_near_zero": int(far * 0.05 * depth) if grows else 0,
                             "max_ulp": int(size.integers(2, 10 ** (1 + depth / 2))) if grows else (1 if d else None),
                             "max_relative_difference": float(size.uniform(0.05, 0.2) * depth) if grows else
                             (float(size.uniform(1e-3, 7e-3)) if far else None),
                             "median_relative_difference": float(size.uniform(5e-3, 7e-3)) if far else None})
    return sweep.frame(rows, sweep.COUNTS_SCHEMA)


def test_fits_and_summary_on_synthetic_counts(spec: dict[str, Any], tmp_path: Path) -> None:
    counts = _synthetic_counts(spec)
    fits_rows, selected = sweep.model_rows(spec, counts)
    assert selected["fp8-scaledmm-cutlass"] == sweep.Selected("generalized-saturation", "generalized-saturation")
    assert selected["int8-cutlass-triton"].parsimony == selected["fp8-cutlass-triton"].parsimony == "constant"
    fits = sweep.frame(fits_rows, sweep.FITS_SCHEMA)
    for pair, chosen in selected.items():  # the fits table marks each rule's model, and the primary has the lowest
        mine = fits[fits["pair"] == pair]
        assert list(mine.loc[mine["selected"] == True, "model"]) == [chosen.primary]  # noqa: E712
        assert list(mine.loc[mine["selected_parsimony"] == True, "model"]) == [chosen.parsimony]  # noqa: E712
        assert mine.loc[mine["selected"] == True, "heldout_rmse"].iloc[0] == mine["heldout_rmse"].min()  # noqa: E712
    sat = fits[(fits["pair"] == "fp8-scaledmm-cutlass") & (fits["model"] == "generalized-saturation")].iloc[0]
    assert sat["alpha"] == pytest.approx(0.518, abs=0.01)
    assert sat["alpha_lower"] < 0.518 < sat["alpha_upper"]
    assert sat["alpha_leave_k_min"] <= sat["alpha"] <= sat["alpha_leave_k_max"]
    assert fits.loc[fits["model"] == "constant", "alpha"].isna().all()
    summary = pd.DataFrame(sweep.summary_rows(spec, counts, selected)).set_index("pair")
    assert summary.loc["int8-cutlass-triton", "rate_test"] == "not rejected"
    assert summary.loc["fp8-scaledmm-cutlass", "rate_test"] == "rejected"
    assert summary.loc["int8-cutlass-triton", "df"] == len(spec["grid"]["k"]) - 1
    assert summary.loc["int8-cutlass-triton", "saturating"] == (selected["int8-cutlass-triton"].primary
                                                                == "generalized-saturation")
    assert summary.loc["fp8-scaledmm-cutlass", "saturating"]
    for pair, chosen in selected.items():
        assert (summary.loc[pair, "selected_model"], summary.loc[pair, "selected_model_parsimony"]) == chosen
    # the assembled rows satisfy the declared schemas
    from int8alibi.files.parquet import write_table

    write_table(fits, tmp_path / "fits.parquet", sweep.FITS_SCHEMA, sweep.FITS_KEY)
    write_table(sweep.frame(list(summary.reset_index().to_dict("records")), sweep.SUMMARY_SCHEMA),
                tmp_path / "summary.parquet", sweep.SUMMARY_SCHEMA, sweep.SUMMARY_KEY)


def test_counts_rows_carry_the_new_estimators_through_the_parquet_schema(tmp_path: Path) -> None:
    """A CPU comparison's row, written and read back: median and share of all equal their definitions."""
    from int8alibi.ksweep.stats import compare
    from int8alibi.files.parquet import write_table

    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 96, generator=g).to(torch.bfloat16)
    b = (a.float() * (1 + 2e-2 * torch.randn(64, 96, generator=g))).to(torch.bfloat16)
    s = compare(a, b, near_zero_fraction=0.01, edges=[1, 2, 3, 5, 9, 17, 65])
    row = {"pair": "fp8-x", "format": "fp8", "k": 96, "seed": 0, "arm_a": "x", "arm_b": "y", "status": sweep.RUN,
           "m": 64, "n": 96, **sweep._stat_row(s)}
    write_table(sweep.frame([row], sweep.COUNTS_SCHEMA), tmp_path / "c.parquet", sweep.COUNTS_SCHEMA, sweep.COUNTS_KEY)
    back = read_table(tmp_path / "c.parquet", sweep.COUNTS_SCHEMA).iloc[0]
    a64, b64 = a.double().numpy().ravel(), b.double().numpy().ravel()
    far = np.abs(a64) >= 0.01 * np.sqrt(np.mean(a64**2))
    rel = (np.abs(a64 - b64) / np.abs(a64))[far & (a64 != b64)]
    assert back["median_relative_difference"] == pytest.approx(float(np.median(rel)), rel=1e-12)
    assert back["max_relative_difference"] == pytest.approx(float(rel.max()), rel=1e-12)
    assert back["ge2_ulp_share_of_all"] == pytest.approx(back["ge2_ulp_non_near_zero"] / a.numel())
    assert back["ge2_ulp_share"] == pytest.approx(back["ge2_ulp_non_near_zero"] / back["differing_non_near_zero"])


def test_arm_choice_falls_back_or_says_why(monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any]) -> None:
    def fake(name: str, fmt: str, device: torch.device):
        if name.startswith("vllm"):
            return None, "not run: vLLM absent"
        return (lambda q: q.a_q), "ok"

    monkeypatch.setattr(sweep, "runner", fake)
    pairs = {p["id"]: p for p in spec["pairs"]}
    names, runners, status = sweep.choose_arms(pairs["int8-cutlass-triton"], torch.device("cuda"))
    assert names == ["cublaslt", "triton"] and status == sweep.RUN and set(runners or {}) == set(names)
    names, runners, status = sweep.choose_arms(pairs["fp8-cutlass-triton"], torch.device("cuda"))
    assert runners is None and status == "not run: vLLM absent" and names == ["vllm-cutlass", "vllm-triton"]


def test_fp8_arms_refuse_int8_operands_names() -> None:
    from int8alibi.errors import InputError

    if not torch.cuda.is_available():
        assert ksweep_arms.runner("torch-scaled-mm", "fp8", torch.device("cpu")) == (None, sweep.NO_GPU)
        return
    with pytest.raises(InputError, match="does not take fp8"):
        ksweep_arms.runner("cublaslt", "fp8", torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_reduced_sweep_on_the_gpu(spec: dict[str, Any]) -> None:
    """Three K points, two seeds: INT8 arms equal their exact emulations, differ by at most one spacing,
    every arm repeats itself bit for bit; torch._scaled_mm vs vLLM CUTLASS differs more at larger K."""
    small = copy.deepcopy(spec)
    small["grid"].update(k=[512, 4096, 32768], seeds=[0, 1])
    counts, ulps, evidence = sweep.sweep(small, torch.device("cuda"))
    frame = sweep.frame(counts, sweep.COUNTS_SCHEMA)
    ran = frame[frame["status"] == sweep.RUN]
    int8 = ran[ran["format"] == "int8"]
    assert len(int8) == 6
    assert int8["a_equals_emulation"].all() and int8["b_equals_emulation"].all()
    assert (int8["max_ulp"].dropna() <= 1).all()
    assert ran["a_repeatable"].all() and ran["b_repeatable"].all()
    fp8 = ran[ran["pair"] == "fp8-scaledmm-cutlass"]
    if len(fp8):
        by_k = fp8.groupby("k")["prevalence"].mean()
        assert by_k.is_monotonic_increasing and by_k.iloc[-1] > by_k.iloc[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_reduced_sweep_of_the_fallback_pairs_on_the_gpu(spec: dict[str, Any]) -> None:
    """Without vLLM: cublaslt vs triton equal their emulations; torch._scaled_mm vs the project's
    Triton FP8 kernel repeat themselves and differ more at larger K."""
    small = copy.deepcopy(spec)
    small["grid"].update(k=[512, 32768], seeds=[0, 1])
    small["pairs"] = [{**p, "arms": p["fallback"]} for p in small["pairs"] if p["fallback"] is not None]
    frame = sweep.frame(sweep.sweep(small, torch.device("cuda"))[0], sweep.COUNTS_SCHEMA)
    assert set(frame["status"]) == {sweep.RUN}
    int8 = frame[frame["format"] == "int8"]
    assert list(int8["arm_a"].unique()) == ["cublaslt"] and int8["a_equals_emulation"].all()
    assert int8["b_equals_emulation"].all()
    fp8 = frame[frame["format"] == "fp8"]
    assert list(fp8["arm_b"].unique()) == ["triton-fp8"]
    assert fp8["a_repeatable"].all() and fp8["b_repeatable"].all()
    by_k = fp8.groupby("k")["prevalence"].mean()
    print(f"torch._scaled_mm vs triton-fp8 prevalence by K: {by_k.to_dict()}")
    assert by_k.loc[32768] > by_k.loc[512]


def test_half_ranges_are_disjoint_and_cover_the_grid(spec: dict[str, Any]) -> None:
    k = np.array(spec["grid"]["k"], dtype=float)
    split = spec["models"]["exponent_interval"]["half_split_k"]
    assert spec["models"]["exponent_interval"]["halves"] == "disjoint"
    low, high = sweep.half_ranges(k, split)
    assert not (low & high).any() and (low | high).all()
    assert k[low].tolist() == [512, 1024, 2048, 4096] and k[high].tolist() == [8192, 16384, 32768]
