"""``int8alibi conform`` on deliberately faulty toy arms defined here (loaded as module:function)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from int8alibi.tools.conform import main
from int8alibi.kernels.layer_operands import ModelShapes, save_operands, synthetic_layers

PROJECT = Path(__file__).resolve().parents[2]
SHAPES = ModelShapes(1, (("mlp", "up_proj", 256, 64), ("mlp", "down_proj", 320, 48)))


def _scaled(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    acc = a_q.to(torch.int64) @ w_q.to(torch.int64).T  # small operands: no int32 overflow
    return (acc.to(torch.float32) * s_a[:, None]) * s_w[None, :]


def truncating_scaled_mm(a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """A faulty kernel: the right epilogue, but the output cast drops the low 16 bits (rounds toward zero)."""
    return (_scaled(a_q, w_q, s_a, s_w).view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)


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


def conform(arm_b: str, operand_file: Path, out: Path, arm_a: str = "exact-triton-order") -> tuple[int, pd.DataFrame]:
    code = main(["--arm-a", arm_a, "--arm-b", arm_b, "--operands", str(operand_file), "--out", str(out),
                 "--device", "cpu", "--protocol", str(PROJECT / "preregistration")])
    table = pd.read_parquet(out / "conform.parquet") if (out / "conform.parquet").exists() else pd.DataFrame()
    return code, table


def flags(table: pd.DataFrame, regime: str, check: int) -> pd.DataFrame:
    return table[(table["regime"] == regime) & (table["check"] == check)]


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
