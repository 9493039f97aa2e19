"""The batch-invariance summary on hand-made rows: shares, the worst M, outcomes against the predictions."""

from __future__ import annotations

import pandas as pd

from int8alibi.batch.summary import by_m, outcome, summary

PREDICTIONS = {"int8": {"identical": True}, "bf16": {"identical": None}, "fp8": {"identical": None},
               "sequence": {"identical": None}}


def layer(gemm: str, kind: str, m: int, rows: int, differing: int, max_ulp: int | None, name: str = "l0") -> dict:
    return {"checkpoint": "own", "layer": name, "gemm": gemm, "kind": kind, "captured_m": 8, "m": m, "draws": 2,
            "rows": rows, "rows_differing": differing, "elements_differing": differing * 3, "max_ulp": max_ulp,
            "nonfinite_differing": 0}


def test_outcome_holds_only_when_nothing_differs() -> None:
    assert outcome(True, 0) == "holds" and outcome(True, 1) == "fails"
    assert outcome(None, 0) == outcome(None, 5) == "no prediction"


def test_summary_reads_each_gemm_and_level_against_its_prediction() -> None:
    layers = pd.DataFrame([layer("a", "int8", 1, 2, 0, 0), layer("a", "int8", 8, 16, 0, 0),
                           layer("a", "int8", 1, 2, 0, 0, "l1"), layer("a", "int8", 8, 16, 0, 0, "l1"),
                           layer("b", "int8", 1, 2, 1, 1), layer("b", "int8", 8, 16, 0, 0),
                           layer("bf16", "bf16", 1, 2, 2, 3), layer("bf16", "bf16", 8, 16, 2, 1)])
    table = by_m(layers).set_index(["gemm", "m"])
    assert table.loc[("a", 1), "layers"] == 2 and table.loc[("a", 1), "rows"] == 4
    assert table.loc[("bf16", 1), "share"] == 1.0 and table.loc[("bf16", 8), "share"] == 2 / 16
    seqs = pd.DataFrame([{"checkpoint": "own", "arm": "a", "identical": True, "module": None},
                         {"checkpoint": "own", "arm": "a", "identical": False, "module": "lm_head"},
                         {"checkpoint": "own", "arm": "a", "identical": False, "module": "model.norm"},
                         {"checkpoint": "own", "arm": "a", "identical": False, "module": "lm_head"}])
    out = summary(layers, seqs, PREDICTIONS).set_index(["level", "gemm"])
    a, b, bf = out.loc[("layer", "a")], out.loc[("layer", "b")], out.loc[("layer", "bf16")]
    assert (a["compared"], a["differing"], a["outcome"], pd.isna(a["worst_m"])) == (36, 0, "holds", True)
    assert (b["differing"], b["outcome"], b["worst_m"], b["max_ulp"]) == (1, "fails", 1, 1)
    assert (bf["outcome"], bf["worst_m"], bf["max_ulp"], bool(pd.isna(bf["predicted_identical"]))) == (
        "no prediction", 1, 3, True)
    s = out.loc[("sequence", "a")]
    assert (s["compared"], s["differing"], s["unit"]) == (4, 3, "sequences")
    assert s["first_modules"] == "lm_head (2); model.norm (1)" and s["outcome"] == "no prediction"
