"""``int8alibi bench seeded``: the matrices it fills, its table, the bytes check and its refusals."""

from __future__ import annotations

import pytest

from int8alibi.model.seeded_weights import PROCESS_MIN
from int8alibi.tools.bench import seeded


def test_block_matrices_are_the_seven_linears_of_each_block() -> None:
    one = seeded.block_matrices("qwen3-1.7b", 1)
    assert sorted(n.rsplit(".", 2)[-2] for n in one) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                                         "up_proj", "v_proj"]
    assert all(n.startswith("model.layers.0.") for n in one)
    assert one["model.layers.0.mlp.gate_proj.weight"] == (6144, 2048)
    assert max(r * c for r, c in one.values()) >= PROCESS_MIN  # the worker path is what it times
    assert len(seeded.block_matrices("qwen3-1.7b", 2)) == 14


def test_the_table_compares_workers_with_one_process_and_checks_the_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    assert seeded.main(["--preset", "qwen3-1.7b", "--blocks", "1", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2
    one_s, many_s = (float(r.split(" | ")[1]) for r in rows)
    speedup = float(rows[1].strip(" |").split(" | ")[3])
    assert speedup == pytest.approx(one_s / many_s, rel=0.02, abs=0.01)
    assert "bytes identical" in out


def test_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert seeded.main(["--blocks", "0"]) == 2
    assert "--blocks and --workers must be >= 1" in capsys.readouterr().err
