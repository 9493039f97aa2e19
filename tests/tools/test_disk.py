"""``int8alibi disk``: the plan's per-stage figures as a table, one row per config, and the plan's verdict."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from int8alibi.cli import main
from int8alibi.planning.disk import ENV

PROJECT = Path(__file__).resolve().parents[2]
SIZES = ("1.7b", "8b", "14b")


def _gb(cell: str) -> float:
    number, unit = cell.split()
    return float(number) * {"GB": 1.0, "MB": 1e-3}[unit]


def test_one_row_per_config_whose_cells_sum_to_its_total(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(PROJECT)
    monkeypatch.setenv(ENV, "60000")
    files = [arg for size in SIZES for arg in ("--configfile", f"config/synthetic-qwen3-{size}.yaml")]
    assert main(["disk", *files, "--config", f"results_root={tmp_path}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head, rows = lines[0], [line for line in lines[2:] if line.startswith("| config/")]
    assert head.startswith("| config | size profile | model/parent | reference/checkpoint | requant/checkpoints |")
    totals = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        parts, total = [_gb(c) for c in cells[2:-1]], _gb(cells[-1])
        assert sum(parts) == pytest.approx(total, abs=0.05 * len(parts))  # each cell rounded to 0.1 GB
        totals.append(total)
    assert len(rows) == 3 and totals == sorted(totals) and totals[0] < totals[1] < totals[2]
    verdicts = [line for line in lines if line.startswith(str(tmp_path))]
    assert [v.rsplit(": ", 1)[1] for v in verdicts] == ["fits", "the plan refuses it", "the plan refuses it"]
    assert re.search(r"synthetic-qwen3-8b: 9\d\.\d GB still to write of 9\d\.\d GB \(15 of 15 stages unfinished\); "
                     r"62\.9 GB free", verdicts[1]), verdicts[1]
