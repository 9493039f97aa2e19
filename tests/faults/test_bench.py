"""``int8alibi bench faults`` runs a real (tiny) campaign and reports its throughput against the floor."""

from __future__ import annotations

import re

import pytest

from int8alibi.tools.bench.faults import main

from .conftest import PROJECT


def test_bench_reports_cells_per_second_and_the_floor_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--shapes", "qwen3-1.7b", "--m", "4", "--layers", "1", "--device", "cpu",
                 "--protocol", str(PROJECT / "preregistration")])
    assert code == 0
    out = capsys.readouterr().out
    assert "1 layers, 42 cells" in out
    assert re.search(r"campaign\s+[\d.]+ s\s+[\d.]+ cells/s", out)
    ratio = float(re.search(r"ratio\s+([\d.]+) x the floor", out).group(1))  # type: ignore[union-attr]
    assert ratio > 1.0  # the campaign computes the exact accumulator and more
    assert "F6" in out and "2,3,4" in out


def test_bench_refuses_unknown_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--shapes", "gpt-9", "--layers", "1", "--protocol", str(PROJECT / "preregistration")]) == 2
    assert "unknown" in capsys.readouterr().err
