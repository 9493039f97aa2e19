"""``int8alibi conform`` on deliberately faulty toy arms defined here (loaded as module:function)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from int8alibi.faults.pipeline import REGIMES, regime_scales
from int8alibi.tools.conform import main
from int8alibi.kernels.layer_operands import ModelShapes, Operands, load_operands, save_operands, synthetic_layers

PROJECT = Path(__file__).resolve().parents[2]
SHAPES = ModelShapes(1, (("mlp", "up_proj", 256, 64), ("mlp", "down_proj", 320, 48)))


def _scaled(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    acc = a_q.to(torch.int64) @ w_q.to(torch.int64).T  # small operands: no int32 overflow
    return (acc.to(torch.float32) * s_a[:, None]) * s_w[None, :]


def truncating_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """A faulty kernel: the right epilogue, but the output cast drops the low 16 bits (rounds toward zero)."""
    return (_scaled(a_q, w_q, s_a, s_w).view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)


def reference_order(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """exact-cutlass-order's epilogue written out, and an arm identical to it: s_a * (s_w * f32(acc))."""
    acc = a_q.to(torch.int64) @ w_q.to(torch.int64).T
    return ((acc.to(torch.float32) * s_w[None, :]) * s_a[:, None]).to(torch.bfloat16)


def swapped_order_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """A correct kernel in the other legitimate scale order, s_w * (s_a * f32(acc)): at most one bf16 spacing
    from the reference, on the elements where the two float32 roundings fall either side of a bf16 midpoint."""
    return _scaled(a_q, w_q, s_a, s_w).to(torch.bfloat16)


def _nudged(y: torch.Tensor, ulps: dict[int, int]) -> torch.Tensor:
    """``y`` with the magnitude of the given flat elements moved up by that many bf16 spacings."""
    bits = y.view(torch.int16).reshape(-1).clone()
    at = torch.tensor(list(ulps))
    bits[at] += torch.tensor(list(ulps.values()), dtype=torch.int16)
    return bits.view(torch.bfloat16).reshape(y.shape)


def one_ulp_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    return _nudged(reference_order(a_q, w_q, s_a, s_w), {0: 1})


def two_ulp_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    return _nudged(reference_order(a_q, w_q, s_a, s_w), {0: 2})


def one_and_two_ulp_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor,
                              s_w: torch.Tensor) -> torch.Tensor:
    return _nudged(reference_order(a_q, w_q, s_a, s_w), {0: 1, -1: 2})


def inf_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    y = reference_order(a_q, w_q, s_a, s_w)
    y.view(-1)[0] = float("inf")
    return y


def m_dependent_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """A faulty kernel that is not batch invariant: for M below 8 its epilogue takes the other scale order
    (as a kernel that picks another tile configuration for small M might)."""
    if a_q.shape[0] < 8:
        return swapped_order_scaled_mm(a_q, w_q, s_a, s_w)
    return reference_order(a_q, w_q, s_a, s_w)


def input_writing_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """A faulty kernel: correct output, but it writes into the activation scales it was handed."""
    y = _scaled(a_q, w_q, s_a, s_w).to(torch.bfloat16)
    s_a.mul_(2.0)
    return y


@pytest.fixture(scope="module")
def operand_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ops") / "layers.safetensors"
    save_operands(path, list(synthetic_layers(SHAPES, m=16, seed=3)))
    return path


def order_sensitive(layer: str, m: int, k: int, n: int, seed: int) -> Operands:
    """Random int8 operands whose weight scales put row 0's products on bf16 rounding midpoints.

    There the two float32 scale orders, each within a float32 spacing of the exact product, can round
    to neighbouring bf16 values; on random scales that happens about once in 2^16 elements, too
    rarely for a small layer to show it.
    """
    g = torch.Generator().manual_seed(seed)
    a_q = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    s_a = (torch.rand(m, generator=g, dtype=torch.float64) * 1e-2 + 1e-3).to(torch.float32)
    acc0 = (a_q[0].to(torch.int64) @ w_q.to(torch.int64).T).to(torch.float64)
    midpoint = 1 + (torch.randint(0, 128, (n,), generator=g).to(torch.float64) + 0.5) / 128
    s_w = (midpoint / (acc0.where(acc0 != 0, 1.0) * s_a[0].double())).abs().to(torch.float32)
    return Operands(layer, 0, layer.rsplit(".", 1)[-1], a_q, s_a, w_q, s_w)


@pytest.fixture(scope="module")
def order_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ops") / "order.safetensors"
    save_operands(path, [order_sensitive("model.layers.0.mlp.up_proj", 16, 32, 256, 5),
                         order_sensitive("model.layers.0.mlp.down_proj", 8, 48, 128, 6)])
    return path


def conform(arm_b: str, operand_file: Path, out: Path, arm_a: str = "exact-triton-order",
            *extra: str) -> tuple[int, pd.DataFrame]:
    code = main(["--arm-a", arm_a, "--arm-b", arm_b, "--operands", str(operand_file), "--out", str(out),
                 "--device", "cpu", "--protocol", str(PROJECT / "preregistration"), *extra])
    table = pd.read_parquet(out / "conform.parquet") if (out / "conform.parquet").exists() else pd.DataFrame()
    return code, table


def flags(table: pd.DataFrame, regime: str, check: int) -> pd.DataFrame:
    return table[(table["regime"] == regime) & (table["check"] == check)]


def per_setting(table: pd.DataFrame) -> pd.DataFrame:
    """One row per layer x regime, indexed by them (the readings repeat on every check's row)."""
    return table[table["check"] == 6].set_index(["layer", "regime"])


def independent_differing(operand_file: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(differing, elements) per setting, from the reference order and the swapped one run here directly."""
    counts = {}
    for op in load_operands(operand_file):
        for regime in REGIMES:
            s_a, s_w = regime_scales(op.s_a, regime, "s_a"), regime_scales(op.s_w, regime, "s_w")
            y_ref = reference_order(op.a_q, op.w_q, s_a, s_w)
            y_swapped = swapped_order_scaled_mm(op.a_q, op.w_q, s_a, s_w)
            counts[op.layer, regime] = (int((y_ref.view(torch.int16) != y_swapped.view(torch.int16)).sum()),
                                        y_ref.numel())
    return counts


def test_truncating_arm_fails_the_pow2_identity_but_passes_the_tolerance(
        operand_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, table = conform(f"{__name__}:truncating_scaled_mm", operand_file, tmp_path)
    assert code == 1
    assert len(table) == 2 * 2 * 6  # layers x regimes x checks 1-6
    five = flags(table, "pow2", 5)
    assert five["applicable"].all() and five["fired"].astype(bool).all()
    six = flags(table, "own", 6)
    assert six["applicable"].all() and not six["fired"].astype(bool).any()
    assert (six["max_ulp"] == 1).all()  # the defect is real, and inside the tolerance
    assert flags(table, "own", 5)["fired"].isna().all() and flags(table, "pow2", 6)["fired"].isna().all()
    four = table[table["check"] == 4]
    # a user arm exposes only its output, so check 4 cannot apply
    assert not four["applicable"].any() and four["reason"].str.contains("arm B").all()
    assert not table[table["check"].isin([1, 2, 3])]["fired"].astype(bool).any()
    printed = capsys.readouterr().out
    assert "check 5: FIRED on 2 of 2" in printed and "cannot certify" in printed
    assert "check 4: NOT APPLICABLE" in printed
    assert (tmp_path / "manifest.json").is_file()


def test_two_correct_epilogue_orders_conform(operand_file: Path, tmp_path: Path) -> None:
    code, table = conform("exact-cutlass-order", operand_file, tmp_path)
    assert code == 0
    assert table[table["applicable"]]["fired"].notna().all()
    assert not table["fired"].fillna(False).astype(bool).any()
    assert table[table["check"] == 4]["applicable"].all()  # both exact arms expose their accumulators


def test_an_arm_that_writes_into_its_inputs_is_a_named_error_not_a_verdict(
        operand_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user arm runs behind the guard (kernels.user_guard), which hands it copies of the operands and
    compares them afterwards: the write is refused, naming the arm and the operand, before any check."""
    code, table = conform(f"{__name__}:input_writing_scaled_mm", operand_file, tmp_path)
    assert code == 2 and table.empty
    printed = capsys.readouterr()
    assert "input_writing_scaled_mm: wrote into its input operand(s)" in printed.out + printed.err


def test_an_unknown_arm_is_an_error_not_a_verdict(operand_file: Path, tmp_path: Path) -> None:
    code, _ = conform("no_such_module:fn", operand_file, tmp_path)
    assert code == 2


def test_the_other_scale_order_passes_the_tolerance_and_the_bitwise_reading_counts_what_differs(
        order_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reviewer's case: a legitimate kernel one bf16 spacing away on some elements passes every check
    (exit 0), and the bitwise reading says on how many."""
    expected = independent_differing(order_file)
    assert sum(expected[layer, "own"][0] for layer, _ in expected) > 0  # the operands do show the order
    code, table = conform(f"{__name__}:swapped_order_scaled_mm", order_file, tmp_path, "exact-cutlass-order")
    assert code == 0
    settings = per_setting(table)
    assert len(settings) == len(expected)
    for key, (differing, elements) in expected.items():
        row = settings.loc[key]
        assert (row["differing"], row["elements"]) == (differing, elements), key
        assert row["bitwise"] == ("differs" if differing else "identical")
        assert row["tolerance"] == ("passed" if key[1] == "own" else "not applicable")
        assert row["max_ulp"] == (1 if differing else 0) and row["nonfinite_mismatch"] == 0
    total = sum(d for d, _ in expected.values())
    elements = sum(e for _, e in expected.values())
    printed = capsys.readouterr().out
    layers = len(expected) // len(REGIMES)
    assert (f"conform: no applicable check fired; tolerance (one bf16 spacing): passed on {layers} of "
            f"{len(expected)} settings, not applicable on {layers}; bitwise: differs in {total:,} of {elements:,} "
            f"elements, max ulp 1\n") in printed


def test_an_identical_arm_reads_bitwise_identical(order_file: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, table = conform(f"{__name__}:reference_order", order_file, tmp_path, "exact-cutlass-order")
    assert code == 0
    settings = per_setting(table)
    assert (settings["bitwise"] == "identical").all() and (settings["differing"] == 0).all()
    printed = capsys.readouterr().out
    assert printed.count("; bitwise identical\n") == len(settings)
    assert printed.rstrip().endswith("; bitwise: identical")


@pytest.mark.parametrize(("arm", "differing", "max_ulp", "nonfinite", "tolerance"), [
    ("one_ulp_scaled_mm", 1, 1, 0, "passed"),
    ("two_ulp_scaled_mm", 1, 2, 0, "failed"),
    ("one_and_two_ulp_scaled_mm", 2, 2, 0, "failed"),
    ("inf_scaled_mm", 1, 0, 1, "failed"),  # inf has no ulp distance: counted apart, and check 6 fires on it
])
def test_bitwise_counts_and_largest_ulp_at_the_tolerance_boundary(
        arm: str, differing: int, max_ulp: int, nonfinite: int, tolerance: str,
        operand_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, table = conform(f"{__name__}:{arm}", operand_file, tmp_path, "exact-cutlass-order")
    assert code == 1  # any difference under power-of-two scales fires check 5
    settings = per_setting(table)
    assert (settings["differing"] == differing).all() and (settings["max_ulp"] == max_ulp).all()
    assert (settings["nonfinite_mismatch"] == nonfinite).all() and (settings["bitwise"] == "differs").all()
    assert (settings.xs("own", level="regime")["tolerance"] == tolerance).all()
    assert (settings.xs("pow2", level="regime")["tolerance"] == "not applicable").all()
    mismatches = f", {len(settings) * nonfinite} non-finite mismatches" if nonfinite else ""
    assert (f"bitwise: differs in {len(settings) * differing} of {int(settings['elements'].sum()):,} elements, "
            f"max ulp {max_ulp}{mismatches}\n") in capsys.readouterr().out


def test_json_prints_one_object_with_the_console_numbers(order_file: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, table = conform(f"{__name__}:swapped_order_scaled_mm", order_file, tmp_path, "exact-cutlass-order",
                          "--json")
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout holds the object alone; the console text went to stderr
    assert report["exit_status"] == code == 0 and report["any_check_fired"] is False
    console, expected = captured.err, independent_differing(order_file)
    for s in report["settings"]:
        bitwise = (f"differs in {s['differing']:,} of {s['elements']:,} elements, max ulp {s['max_ulp']}"
                   if s["differing"] else "identical")
        assert (f"  {s['layer']} {s['regime']} (m={s['m']} k={s['k']} n={s['n']}): tolerance {s['tolerance']}; "
                f"bitwise {bitwise}\n") in console
        assert (s["differing"], s["elements"]) == expected[s["layer"], s["regime"]]
    both = report["overall"]
    assert both["tolerance"] == {"verdict": "passed", "settings": 4, "applicable": 2, "failed": 0}
    bits = both["bitwise"]
    assert bits["verdict"] == "differs" and bits["differing"] == int(per_setting(table)["differing"].sum())
    assert (f"tolerance (one bf16 spacing): passed on 2 of 4 settings, not applicable on 2; bitwise: differs in "
            f"{bits['differing']:,} of {bits['elements']:,} elements, max ulp {bits['max_ulp']}\n") in console


def test_help_names_json_and_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "--json" in text and "exit status: 0 when no applicable check fired, 1 when one did, 2" in text


def test_the_batch_reading_names_an_arm_whose_epilogue_depends_on_m(order_file: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = conform(f"{__name__}:m_dependent_scaled_mm", order_file, tmp_path, "exact-cutlass-order",
                      "--json", "--batch-ms", "1,2,8")
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    batch = pd.read_parquet(tmp_path / "conform_batch.parquet")
    a, b = report["batch"]["arm A: exact-cutlass-order"], report["batch"][f"arm B: {__name__}:m_dependent_scaled_mm"]
    assert a["batch_invariant"] is True and a["rows_differing"] == 0
    # rows drawn into batches of 1 or 2 take the other order: row 0 (on bf16 midpoints) then differs
    differ = batch[(batch["gemm"].str.startswith("arm B")) & (batch["rows_differing"] > 0)]
    assert b["batch_invariant"] is False and set(differ["m"]) <= {1, 2} and b["first_m"] in (1, 2)
    assert b["rows_differing"] == int(differ["rows_differing"].sum()) and b["max_ulp"] == 1
    assert set(batch["m"]) == {1, 2, 8, 16}   # the down_proj layer has 8 rows: 8 is its own M there
    assert f"batch: arm B: {__name__}:m_dependent_scaled_mm: NOT batch invariant" in captured.err
    assert "batch: arm A: exact-cutlass-order: batch invariant: all" in captured.err
    assert code == report["exit_status"]   # the batch reading never changes the exit status


def test_the_batch_reading_refuses_sizes_that_do_not_fit(order_file: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    for bad, why in (("0,2", "every M must be at least 1"), ("x", "expected comma-separated integers"),
                     ("16", "M=16 is larger than the 8 rows of layer model.layers.0.mlp.down_proj")):
        code, _ = conform("exact-triton-order", order_file, tmp_path / bad, "exact-cutlass-order", "--batch-ms", bad)
        assert code == 2 and why in capsys.readouterr().err
        assert not (tmp_path / bad / "conform.parquet").exists()
